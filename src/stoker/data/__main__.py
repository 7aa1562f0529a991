"""``python -m stoker.data prepare ...`` / ``train-tokenizer ...`` (the same as ``stoker data ...``)."""

import sys

from stoker.cli.data import main

if __name__ == "__main__":
    sys.exit(main())
