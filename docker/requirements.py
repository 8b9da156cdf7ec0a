"""Print the package's runtime dependencies from pyproject.toml, one per line (the images install them in a layer of
their own, before the package, so a code change does not re-download torch)."""

import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
