import sys

from batchpilot.cli import main

sys.exit(main())
