import sys

from online.cli import main

sys.exit(main())
