"""`python -m draftfit.assets tokenizers|models|all` — used by `make fixtures` and `make models`."""

import sys

from draftfit.errors import DraftfitError
from draftfit.assets.models import fetch_all_models
from draftfit.assets.tokenizers import fetch_all_tokenizers


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "all"
    try:
        if what in ("tokenizers", "all"):

            for name, path in fetch_all_tokenizers().items():
                print(f"tokenizer {name}: {path}")
        if what in ("models", "all"):

            for name, path in fetch_all_models().items():
                print(f"model {name}: {path}")
    except DraftfitError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
