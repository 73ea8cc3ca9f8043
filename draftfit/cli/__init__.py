"""The `draftfit` command line.

Commands live in `draftfit/commands/<name>.py` and are imported only when invoked, so that
`draftfit --help` and the catalog commands start without torch, transformers, vllm or sklearn.
"""

from __future__ import annotations

import json
import os
import sys

import click

from draftfit import __version__
from draftfit.errors import DraftfitError

# name -> (module:attribute, one-line help shown by `draftfit --help` without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "rank": ("draftfit.cli.commands.rank:rank", "Rank catalog drafts for a target (the main job)."),
    "check": ("draftfit.cli.commands.check:check", "Tokenizer/vocab compatibility of a target and a draft."),
    "memory": ("draftfit.cli.commands.memory:memory", "VRAM co-residency and KV cache, as vLLM sizes it."),
    "measure": ("draftfit.cli.commands.measure:measure", "Measure acceptance through vLLM (or the HF estimator)."),
    "runs": ("draftfit.cli.commands.runs:runs", "List, show and export stored measurements."),
    "speedup": ("draftfit.cli.commands.speedup:speedup", "Expected speedup for a K, acceptance and step cost."),
    "calibrate": ("draftfit.cli.commands.calibrate:calibrate", "Measure step costs on a GPU (vLLM, dummy weights)."),
    "serve-cmd": ("draftfit.cli.commands.launch:serve_cmd", "Print the vllm serve (or SGLang) command."),
    "launch-script": ("draftfit.cli.commands.launch:launch_script", "Write a launch script with checks and readout."),
    "preflight": ("draftfit.cli.commands.preflight:preflight", "All checks for one layout; exit 0/1/2 for CI."),
    "serve-sim": ("draftfit.cli.commands.servesim:serve_sim",
                  "The server at your request rate, with and without speculation."),
    "monitor": ("draftfit.cli.commands.monitor:monitor", "Read a live server's /metrics and advise K."),
    "catalog": ("draftfit.cli.commands.catalog:catalog", "List or show catalog models and GPUs."),
    "fixtures": ("draftfit.cli.commands.fixtures:fixtures", "Fetch the real tokenizers and models (cached)."),
    "sweep": ("draftfit.cli.commands.sweep:sweep", "Many measure/calibrate cells as Ray tasks, resumable."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        import importlib

        module_name, attr = COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Every failure leaves as one line on stderr (and, with --json, {"error", "fix"} on stdout) with a
        non-zero exit: draftfit's own errors, click's usage errors, and, as a last resort, a bug (whose
        traceback DRAFTFIT_DEBUG=1 shows)."""
        argv = list(sys.argv[1:] if args is None else args)
        try:
            # standalone_mode=False: click returns ctx.exit()'s code instead of exiting, and raises the rest here.
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `draftfit` or a bare group: help, exit 0
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            code = 0
        except click.exceptions.Abort:
            _fail(argv, "aborted", None, 130)
        except click.ClickException as exc:  # usage errors: bad option values, missing arguments
            command = next((a for a in argv if a in COMMANDS), None)
            hint = f"see `draftfit {command} --help`" if command else "see `draftfit --help`"
            _fail(argv, exc.format_message(), hint, exc.exit_code or 2)
        except DraftfitError as exc:
            _fail(argv, exc.message, exc.fix, exc.exit_code)
        except (KeyboardInterrupt, BrokenPipeError):
            _fail(argv, "interrupted", None, 130)
        except RecursionError:  # a JSON/YAML file nested deeper than any real one (json's parser recurses)
            _fail(argv, "an input file is nested too deeply to read (thousands of brackets)", "pass the real file",
                  2)
        except OSError as exc:  # the file system refused a path the user gave (name too long, a loop, no access)
            if os.environ.get("DRAFTFIT_DEBUG"):
                raise
            _fail(argv, _os_error_line(exc), "check the path: each folder name at most 255 bytes, readable, "
                  "on a file system with room", 2)
        except Exception as exc:  # a bug: still one line, the traceback on request
            if os.environ.get("DRAFTFIT_DEBUG"):
                raise
            _fail(argv, f"internal error: {type(exc).__name__}: {exc}".splitlines()[0][:300],
                  "please report it; DRAFTFIT_DEBUG=1 shows the traceback", 1)
        if standalone_mode:
            sys.exit(code or 0)
        return code


def _os_error_line(exc: OSError) -> str:
    import errno

    where = str(exc.filename)[:120] + ("..." if len(str(exc.filename)) > 120 else "") if exc.filename else "a path"
    if exc.errno == errno.ENAMETOOLONG:
        return f"{where}: a folder or file name in it is over 255 bytes"
    return f"{where}: {exc.strerror or type(exc).__name__}"


def _fail(argv: list[str], message: str, fix: str | None, exit_code: int):
    line = " ".join(f"{message} — {fix}".split()) if fix else " ".join(str(message).split())
    if "--json" in argv:
        click.echo(json.dumps({"error": " ".join(str(message).split()), "fix": fix, "exit_code": exit_code}))
    click.echo(f"error: {line}", err=True)
    sys.exit(exit_code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="draftfit")
def cli():
    """Which small model should draft for your large one under vLLM, and how.

    \b
    Examples:
      draftfit rank --target Llama-3.1-70B --gpu H100-80GB --tp 2 --workload code
      draftfit check Qwen2.5-7B Qwen2.5-0.5B
      draftfit memory Llama-3.1-70B --draft Llama-3.2-1B --gpu H100-80GB --tp 2
      draftfit serve-cmd Llama-3.1-70B Llama-3.2-1B --tp 2
    """


def main(argv=None):
    cli.main(args=argv, prog_name="draftfit")


if __name__ == "__main__":
    main()
