"""`draftfit monitor`: acceptance from a live vLLM server's /metrics, and the K it suggests."""

from __future__ import annotations

import click

from draftfit.cli.render import json_option
from draftfit.catalog.specs import resolve_model
from draftfit.cli.render import console, emit_json, to_jsonable
from draftfit.errors import DraftfitError
from draftfit.layout import build_layout, check_batches, check_float, check_int, check_tp

MAX_INTERVAL_S = 86400.0  # a day between readings; longer is no monitoring
from draftfit.launch.monitor import DEFAULT_TIMEOUT_S, V0_RATE, read_once, watch


def _print(r, con) -> None:
    def say(text: str) -> None:
        # Server-supplied text and the URL are data: no rich markup, no highlighting.
        con.print(text, highlight=False, markup=False)

    if r.window == "delta":
        head = f"last {r.elapsed_s:.1f}s"
    else:
        head = "since server start"
    if r.acceptance_rate is None:
        msg = "; ".join(r.notes) or "no drafts"
        say(f"{r.url} ({head}): {msg}")
        return
    if r.acceptance_source == "v0_gauge":
        say(f"{r.url} ({head}): acceptance rate {r.acceptance_rate:.3f} (V0 gauge {V0_RATE})")
    elif r.mean_acceptance_length is None:
        say(f"{r.url} ({head}): acceptance rate {r.acceptance_rate:.3f} "
            f"({r.num_accepted}/{r.num_draft_tokens} draft tokens)")
    else:
        say(f"{r.url} ({head}): acceptance rate {r.acceptance_rate:.3f} "
            f"({r.num_accepted}/{r.num_draft_tokens} draft tokens), mean acceptance length "
            f"{r.mean_acceptance_length:.2f} over {r.num_drafts} drafts")
    if r.per_position:
        pp = ", ".join(f"{x:.3f}" for x in r.per_position)
        say(f"  per position (accepted / drafts): {pp}")
    if r.v0_acceptance_rate is not None and r.acceptance_source != "v0_gauge":
        say(f"  V0 gauge {V0_RATE} = {r.v0_acceptance_rate:.3f}")
    a = r.advice
    if a:
        sp = ", ".join(f"K={k}: {v:.2f}x" for k, v in a.speedup_by_k.items())
        say(f"  advice: K={a.best_k} (serving K={a.current_k}). {a.reason}")
        say(f"  expected speedup by K: {sp}; cost: {a.cost_source}")
    for n in r.notes:
        say(f"  note: {n}")


@click.command(name="monitor")
@click.argument("url")
@click.option("--interval", type=float, default=10.0, show_default=True,
              help="Seconds between readings (deltas).")
@click.option("--once", is_flag=True, help="One cumulative reading since server start, then exit.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after N interval readings.")
@click.option("--timeout", "timeout_s", type=float, default=DEFAULT_TIMEOUT_S,
              show_default=True, help="Seconds one scrape of /metrics may take in all (connect, headers, body).")
@click.option("--cost-ratio", type=float, default=None,
              help="Draft step cost / target decode step cost used to advise K (default 0.1).")
@click.option("--target", default=None, help="Served target (with --draft and --gpu: K advice from step costs).")
@click.option("--draft", default=None, help="Served draft.")
@click.option("--gpu", default=None, help="GPU the server runs on (catalog name).")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--batch", type=int, default=1, show_default=True, help="Typical batch size, for the K advice.")
@json_option
def monitor(url, interval, once, count, timeout_s, cost_ratio, target, draft, gpu, tp, batch, as_json):
    """Read URL/metrics (a vLLM server): acceptance rate, mean acceptance length, per position, and K advice."""

    interval = check_float(interval, "--interval", 0, MAX_INTERVAL_S, lo_open=True, fix="seconds, e.g. --interval 10")
    timeout_s = check_float(timeout_s, "--timeout", 0, MAX_INTERVAL_S, lo_open=True, fix="seconds, e.g. --timeout 10")
    if cost_ratio is not None:
        cost_ratio = check_float(cost_ratio, "--cost-ratio", 0, 1e6,
                                 fix="the draft/target step cost ratio, e.g. --cost-ratio 0.1")
    check_batches((batch,))
    layout = None
    if target or draft or gpu:
        if not (target and draft and gpu):
            raise DraftfitError("--target, --draft and --gpu go together", fix="pass all three, or none")

        t_spec = resolve_model(target)
        layout = {"layout": build_layout(t_spec, gpu=gpu, tp=check_tp(t_spec, tp), batches=(batch,), fit_context=False),
                  "draft": resolve_model(draft)}
    else:
        check_int(tp, "--tp", 1, 64, fix="pass --tp 1, 2, 4 or 8")
    con = console()
    if once:
        r = read_once(url, cost_ratio=cost_ratio, layout=layout, timeout_s=timeout_s)
        emit_json(r) if as_json else _print(r, con)
        return
    try:
        for r in watch(url, interval, cost_ratio=cost_ratio, count=count, layout=layout, timeout_s=timeout_s):
            if as_json:
                import json

                click.echo(json.dumps(to_jsonable(r)))
            else:
                _print(r, con)
    except KeyboardInterrupt:
        pass
