"""spec.signature: a target or grad_fn whose signature differs from the call the suite makes is
reported once, naming the keyword or the arguments and the fix (a wrapper, which then conforms),
and a TypeError raised inside the target is not mistaken for one; the keyword arguments a call may
carry are those the declared keywords pass.

``sdpa`` below is importable (``test_spec_signature:sdpa``) for the pytest plugin's test."""

from __future__ import annotations

import pytest

import spec
from impl import attention
from spec.keywords import registered


def sdpa(q, k, v, is_causal=False):
    """PyTorch's spelling: ``is_causal`` where the suite passes ``causal``."""
    return attention(q, k, v, causal=is_causal)


def test_a_pytorch_style_signature_is_reported_once_with_the_fix():
    """A target spelled as PyTorch's (is_causal=) is reported once, with its signature as found and
    a wrapper that fixes it (and then conforms), the later laws skipped: not the same TypeError from
    every law that passes causal=True."""
    report = spec.check(sdpa, profile="quick")
    (failed,) = report.failures
    assert "does not take the keyword causal=" in failed.message
    assert "sdpa(q, k, v, is_causal=False)" in failed.message  # its signature, as found
    assert "Target(fn, causal_alignment=None)" in failed.message
    wrapper = failed.message.split("wrap it: ", 1)[1]
    assert wrapper == "def f(q, k, v, *, causal=False): return sdpa(q, k, v, is_causal=causal)"
    after = report.results[report.results.index(failed) + 1:]
    assert after and all(r.status == "skip" and f"see {failed.name}" in r.message for r in after)
    assert "TypeError" not in str(report).replace(failed.message, "")  # said once
    # The fix it shows works: the wrapper conforms.
    scope = {"sdpa": sdpa}
    exec(wrapper, scope)
    assert spec.check(scope["f"], profile="quick", only=["causal_no_leak", "matches_golden"]).ok


def test_a_required_keyword_the_suite_never_passes_is_named():
    def needs_flag(q, k, v, *, is_causal):
        return attention(q, k, v, causal=is_causal)

    report = spec.check(needs_flag, profile="quick", only=["matches_golden", "rows_sum_to_one"])
    first, second = report.results
    assert first.status == "fail" and first.fatal
    assert "requires the argument is_causal, which the suite never passes" in first.message
    assert "give is_causal a default" in first.message
    assert second.status == "skip" and "not run: see matches_golden" in second.message


def forgets_v(q, k):
    """Takes two arrays where the suite passes three."""
    return q


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_target_that_takes_too_few_arguments_is_reported_once(isolation):
    """A target that takes fewer arguments than the suite passes is reported once, in thread and
    process isolation alike, with its signature and the wrapper to write; the later laws are skipped,
    not each failed with "takes 2 positional arguments but 3 were given"."""
    report = spec.check(forgets_v, profile="quick", isolation=isolation)
    (failed,) = report.failures
    assert failed.fatal and failed.message.startswith(
        "the target cannot be called as the suite calls it, forgets_v(q, k, v): takes 2 positional "
        "arguments but 3 were given (its signature: forgets_v(q, k));")
    assert failed.message.endswith("wrap it: def f(q, k, v, *, causal=False): "
                                   "return forgets_v(<q, k, v as it takes them>)")
    after = report.results[report.results.index(failed) + 1:]
    assert after and all(r.status == "skip" and r.message.startswith("not run: see") for r in after)


def test_the_call_shown_carries_the_keywords_passed():
    def keyword_only(*, q, k, v, causal=False):
        return attention(q, k, v, causal=causal)

    (result,) = spec.check(keyword_only, profile="quick", only=["causal_no_leak"]).results
    assert result.fatal and result.message.startswith(
        "the target cannot be called as the suite calls it, keyword_only(q, k, v, causal=True): takes 0 "
        "positional arguments but 3 positional arguments (and 1 keyword-only argument) were given")


def test_a_grad_fn_that_takes_too_few_arguments_is_named():
    def grad(q, k, v, *, causal=False):  # no d_out
        raise AssertionError("never bound")

    (result,) = spec.check(spec.Target(attention, grad_fn=grad), profile="quick",
                           only=["grad_matches_golden"]).results
    assert result.fatal and result.message.startswith(
        "grad_fn cannot be called as the suite calls it, grad(q, k, v, d_out")


def test_a_type_error_inside_the_target_is_not_mistaken_for_its_signature():
    def buggy(q, k, v, *, causal=False):
        return sorted([1, "a"])  # TypeError from the target's own code

    (result,) = spec.check(buggy, profile="quick", only=["matches_golden"]).results
    assert result.status == "fail" and not result.fatal
    assert result.message.startswith("the target raised TypeError: '<' not supported")


def test_a_grad_fn_with_another_signature_is_named_too():
    def grad(q, k, v, d_out, *, is_causal=False):
        raise AssertionError("never bound")

    report = spec.check(spec.Target(attention, grad_fn=grad), profile="quick",
                        only=["grad_causal_no_leak"])
    (result,) = report.results
    assert "grad_fn does not take the keyword causal=" in result.message
    assert result.message.endswith("def f(q, k, v, d_out, *, causal=False): "
                                   "return grad(q, k, v, d_out, is_causal=causal)")


def test_a_declared_keyword_is_the_keyword_arguments_the_calling_layer_accepts():
    passed = spec.signature.declared_by()
    for kw in registered().values():
        assert all(passed[arg] == f"{kw.field}=False" for arg in kw.passes)
