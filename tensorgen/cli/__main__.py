import sys

from tensorgen.cli.main import main

sys.exit(main())
