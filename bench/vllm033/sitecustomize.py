# Installed into /root/site2 (first on PYTHONPATH) for vLLM 0.33 on the H200 image.
# The image's torchvision 0.26 / torchaudio 2.11 are built for its torch 2.11 and break against torch 2.14;
# nothing vLLM needs for text models imports them, so make them look absent (find_spec -> None).
import sys, os, importlib.machinery, importlib.util
for _m in ("torchvision", "torchaudio"):
    sys.modules.setdefault(_m, None)
# chain to an image sitecustomize, if there is one further down sys.path; once only (the image's may chain too)
if not getattr(sys, "_site2_sitecustomize", False):
    sys._site2_sitecustomize = True
    try:
        _here = os.path.dirname(os.path.abspath(__file__))
        _rest = [p for p in sys.path if p and os.path.abspath(p) != _here]
        _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
        if _spec and _spec.origin and os.path.abspath(_spec.origin) != os.path.abspath(__file__):
            _mod = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(_mod)
    except Exception as _e:  # keep going without it, as Python itself would
        sys.stderr.write(f"site2 sitecustomize: image sitecustomize failed: {_e!r}\n")
