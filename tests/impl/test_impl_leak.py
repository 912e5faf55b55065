"""impl.leak, the causal-mask experiment (16 tokens, token 10 changed: with the causal mask no
earlier output moves), and its command line ``python -m impl`` (impl/__main__.py)."""

from __future__ import annotations

from impl.leak import leak_experiment


def test_causal_mask_blocks_the_leak_bit_for_bit():
    masked = leak_experiment(n_tokens=16, changed=10, causal=True)
    unmasked = leak_experiment(n_tokens=16, changed=10, causal=False)
    assert (masked[:10] == 0.0).all()  # positions 0-9 bit-identical
    assert (masked[10:] > 0).all()
    assert (unmasked[:10] > 1e-3).all()  # without the mask every earlier position moves


def test_impl_help_prints_help_and_exits_0(capsys):
    from impl.__main__ import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m impl") and "causal-mask experiment" in out


def test_impl_bad_argument_is_one_line_and_exit_2(capsys):
    from impl.__main__ import main

    assert main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "python -m impl: error: unrecognized arguments: --bogus\n"
