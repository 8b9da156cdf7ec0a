"""Print what one image needs from pyproject.toml, one requirement a line: the base dependencies plus those of the
extras named on the command line (`runtime`, `operator`). The images install them in a layer of their own, before the
package, so a code change does not re-download torch.

    python requirements.py pyproject.toml runtime
"""

import sys

import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
requirements = list(project["dependencies"])
for extra in sys.argv[2:]:
    requirements += project["optional-dependencies"][extra]
print("\n".join(requirements))
