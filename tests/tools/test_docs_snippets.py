"""The code blocks of README.md and docs/ run as printed. ``>>>`` blocks are doctests (tox runs
them); every other ```python block is executed here, in a fresh namespace, from the repository
root; the tutorial's own claims about what its code does are checked too."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import spec
from tools import docs_outputs

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)


def snippets() -> list[tuple[str, int, str]]:
    """(page, line, code) of each ```python block that is not a doctest."""
    found = []
    for path in docs_outputs.files():
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if not m["code"].lstrip().startswith(">>>"):
                found.append((path.name, text.count("\n", 0, m.start()) + 1, m["code"]))
    return found


SNIPPETS = snippets()


def run(code: str) -> dict:
    scope: dict = {"__name__": "snippet"}
    exec(compile(code, "<snippet>", "exec"), scope)
    return scope


def test_the_tutorial_has_snippets():
    assert sum(page == "tutorial.md" for page, _, _ in SNIPPETS) >= 3


@pytest.mark.parametrize(("page", "line", "code"), SNIPPETS, ids=[f"{p}:{n}" for p, n, _ in SNIPPETS])
def test_each_snippet_runs_as_printed(page, line, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    if "import torch" in code and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch (the torch extra)")
    run(code)


def test_the_tutorials_target_is_the_example_and_conforms_as_shown():
    """The tutorial's targets are examples/my_attention.py's, declarations and all (empty_keys="raise"
    among them): the declared one conforms as the page says, the undeclared one fails
    masked_rows_policy; a page whose Target drifted from the file would teach one that fails."""
    code = next(code for page, _, code in SNIPPETS if page == "tutorial.md" and "def attention" in code)
    scope = run(code)
    from examples import my_attention

    for name in ("target", "undeclared"):
        shown, real = scope[name], getattr(my_attention, name)
        assert shown.replace(fn=real.fn) == real, name  # the same declarations as the file
    assert spec.check(scope["target"], profile="quick").ok
    (result,) = spec.check(scope["undeclared"], profile="quick", only=["masked_rows_policy"]).results
    assert result.status == "fail"


def test_the_tutorials_torch_wrapper_passes_as_claimed():
    pytest.importorskip("torch")
    code = next(code for page, _, code in SNIPPETS if page == "tutorial.md" and "from_torch" in code)
    assert spec.check(run(code)["target"], profile="quick").ok


SERVING_KERNELS = {"causal": "causal_attention", "decode": "decode_attention",
                   "chunked_prefill": "chunked_prefill_attention", "prefill": "prefill_attention",
                   "paged": "paged_attention"}


def test_the_serving_kernels_shown_are_the_examples():
    """docs/targets.md, "Declare a serving kernel", shows each kernel of examples/serving_kernels.py
    as the file has it, and declares it as the file does: the file is what the tests check and what
    the shown outputs ran, so a page that drifted from it would teach a kernel nothing checks."""
    pytest.importorskip("ml_dtypes")  # the paged kernel's float8 caches
    from examples import serving_kernels

    page = (ROOT / "docs" / "targets.md").read_text(encoding="utf-8")
    for name in ("attend", *SERVING_KERNELS.values()):
        assert inspect.getsource(getattr(serving_kernels, name)) in page, name
    shown: dict = {}
    for path, _, code in SNIPPETS:
        if path == "targets.md" and "from examples.serving_kernels import attend" in code:
            shown |= run(code)
    for target, fn in SERVING_KERNELS.items():
        real = getattr(serving_kernels, target)
        assert shown[target].fn.__name__ == fn
        assert shown[target].replace(fn=real.fn) == real, target  # the same declarations as the file
