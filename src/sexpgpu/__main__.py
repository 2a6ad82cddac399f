import sys

from sexpgpu.cli.main import main

sys.exit(main())
