import sys

from online.cli.main import main

sys.exit(main())
