"""`python -m volta_ml.cli ...` runs the `volta-ml` command."""
import sys

from volta_ml.cli import main

sys.exit(main())
