#!/usr/bin/env python3
"""Checks draftfit's `vllm serve ...` commands against the installed vLLM (0.34 on the lent H200) without starting
an engine (issue 38 item 3). Runs on the GPU machine under /root/env034.sh; stdlib + vLLM only, imports nothing
from draftfit (the command list is written here by bench/serve_commands.py).

For each command, the stages, each recorded:
  parse   vLLM's own `vllm serve` parser: the top-level FlexibleArgumentParser with the serve subcommand that
          vllm/entrypoints/cli/serve.py registers (make_arg_parser in vllm/entrypoints/common/cli_args.py for
          0.34, vllm/entrypoints/openai/cli_args.py before), then the serve checks (validate_parsed_serve_args)
          and `args.model = args.model_tag` as ServeSubcommand.cmd does;
  engine_args  AsyncEngineArgs.from_cli_args(args);
  config  engine_args.create_engine_config(): ModelConfig, SpeculativeConfig (draft model, EAGLE-3 head, n-gram,
          suffix), cache/quantization checks. The machine is offline, so the hub ids are swapped for folders
          holding each model's public config.json (tools/configs/<name>; the command entry's "models" map, else
          the id's last part without -Instruct) and the tokenizer is not loaded (skip_tokenizer_init); both
          substitutions are written into the result.
A command is ok when all three pass.

usage: python3 parse_commands.py COMMANDS.json OUT.json [--configs DIR]
COMMANDS.json: a list of command strings, or of {"id", "command", "models": {hub_id: config_folder}} objects."""
import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def build_parser():
    """The parser `vllm serve` uses, and how it was obtained (the route is recorded with every result)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    top = FlexibleArgumentParser(description="vLLM CLI")
    sub = top.add_subparsers(required=False, dest="subparser")
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        cmd = ServeSubcommand()
        cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
        return top, cmd.validate, "vllm.entrypoints.cli.serve.ServeSubcommand"
    except ImportError as exc:  # a server-only dependency missing here: the same parser, built one level down
        route_err = repr(exc)
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
        mod = "vllm.entrypoints.common.cli_args"
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        mod = "vllm.entrypoints.openai.cli_args"
    make_arg_parser(sub.add_parser("serve"))
    return top, validate_parsed_serve_args, f"{mod}.make_arg_parser (ServeSubcommand: {route_err})"


def local_folder(ref, models, configs):
    """The config folder standing in for a hub id (offline machine), or None when there is none."""
    if not ref:
        return None
    name = models.get(ref) or ref.rstrip("/").split("/")[-1]
    for cand in (name, name.replace("-Instruct", ""), name.replace("-Base", "")):
        p = os.path.join(configs, cand)
        if os.path.isfile(os.path.join(p, "config.json")):
            return p
    return None


def _argv(command):
    """shlex-split, leading VAR=value assignments set aside; `python -m vllm.entrypoints.openai.api_server
    --model M` becomes `serve M` so that both of draftfit's launchers go through the serve parser."""
    words = shlex.split(command)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    if words[:2] == ["vllm", "serve"]:
        return words[1:], env
    if words[:3] in (["python", "-m", "vllm.entrypoints.openai.api_server"],
                     ["python3", "-m", "vllm.entrypoints.openai.api_server"]):
        rest = words[3:]
        return ["serve", *rest], env
    raise ValueError(f"not a `vllm serve` command: {command[:80]!r}")


def check_one(entry, parser, validate, configs):
    cmd = entry if isinstance(entry, str) else entry["command"]
    cid = None if isinstance(entry, str) else entry.get("id")
    models = {} if isinstance(entry, str) else (entry.get("models") or {})
    res = {"id": cid, "command": cmd, "ok": False, "stage": "split"}
    try:
        argv, env = _argv(cmd)
        res["env"] = env
        res["stage"] = "parse"
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse reports bad flags by exiting: keep its message
            raise ValueError(f"argparse exit {exc.code}: {err.getvalue().strip().splitlines()[-1:] or ['']}"[:800])
        validate(args)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        res["parsed"] = {k: getattr(args, k, None) for k in (
            "model", "speculative_config", "max_model_len", "quantization", "kv_cache_dtype",
            "tensor_parallel_size", "gpu_memory_utilization", "dtype", "enforce_eager")}
        # The machine is offline: swap hub ids for config folders on the parsed namespace, BEFORE the engine args
        # exist (the first lease swapped after from_cli_args, and 0.34's EngineArgs already looked the hub id up
        # there: LocalEntryNotFoundError at stage engine_args for all 16 commands).
        res["stage"] = "swap"
        subst = {}
        loc = local_folder(args.model, models, configs)
        if loc:
            subst[args.model] = loc
            args.model = loc
            if hasattr(args, "tokenizer"):
                args.tokenizer = None
        if hasattr(args, "skip_tokenizer_init"):
            args.skip_tokenizer_init = True
        spec = getattr(args, "speculative_config", None)
        if isinstance(spec, str):
            spec = json.loads(spec)
        if isinstance(spec, dict) and spec.get("model"):
            dloc = local_folder(spec["model"], models, configs)
            if dloc:
                subst[spec["model"]] = dloc
                spec = dict(spec, model=dloc)
            args.speculative_config = spec
        res["stage"] = "engine_args"
        from vllm.engine.arg_utils import AsyncEngineArgs
        ea = AsyncEngineArgs.from_cli_args(args)
        ea.skip_tokenizer_init = True
        res["stage"] = "config"
        res["substituted"] = subst
        t0 = time.time()
        vc = ea.create_engine_config()
        sc = vc.speculative_config
        res["config"] = {
            "s": round(time.time() - t0, 2),
            "max_model_len": vc.model_config.max_model_len,
            "quantization": vc.model_config.quantization,
            "kv_cache_dtype": vc.cache_config.cache_dtype,
            "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
            "speculative": None if sc is None else {
                "method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens,
                "draft_model": getattr(getattr(sc, "draft_model_config", None), "model", None),
                "draft_tensor_parallel_size": getattr(getattr(sc, "draft_parallel_config", None),
                                                      "tensor_parallel_size", None)}}
        res["ok"] = True
        res["stage"] = "done"
    except Exception as exc:  # noqa: BLE001 - every failure is a result here, not a crash
        res["error"] = f"{type(exc).__name__}: {exc}"[:1200]
        res["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("commands")
    ap.add_argument("out")
    ap.add_argument("--configs", default=os.path.join(HERE, "configs"))
    a = ap.parse_args(argv)
    entries = json.load(open(a.commands))
    import vllm
    parser, validate, route = build_parser()
    results = [check_one(e, parser, validate, a.configs) for e in entries]
    report = {"vllm": vllm.__version__, "route": route, "n": len(results),
              "n_ok": sum(r["ok"] for r in results), "results": results}
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    for r in results:
        print(f"[serve-check] {'ok ' if r['ok'] else 'ERR'} {r['id'] or r['command'][:60]}"
              + ("" if r["ok"] else f" at {r['stage']}: {r.get('error', '')[:200]}"), flush=True)
    print(f"[serve-check] vLLM {vllm.__version__}: {report['n_ok']}/{report['n']} ok; parser: {route}", flush=True)


if __name__ == "__main__":
    main()
