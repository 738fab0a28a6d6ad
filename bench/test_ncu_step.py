"""CPU tests of bench/ncu_step.py's arguments: a bad one is refused with its name and the reason,
and --check validates without a GPU."""
import pytest

import ncu_step


def refused(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        ncu_step.parse(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_check_validates_without_a_gpu(capsys):
    assert ncu_step.main(["--impl", "sonicmoe", "--shape", "qwen3-30b-a3b", "--check"]) == 0
    out = capsys.readouterr().out
    assert "sonicmoe on qwen3-30b-a3b (T = 32768, random routing): arguments valid" in out


def test_tokens_default_to_the_shape_and_may_be_set(capsys):
    assert ncu_step.main(["--impl", "moeblaze", "--shape", "mixtral-8x7b", "--tokens", "4096", "--check"]) == 0
    assert "(T = 4096," in capsys.readouterr().out


def test_bad_arguments_name_the_argument_and_the_reason(capsys):
    assert "--impl: unknown 'scattermoe'" in refused(capsys, "--impl", "scattermoe", "--shape", "qwen3-30b-a3b")
    assert "--shape: unknown 'qwen9'" in refused(capsys, "--impl", "moeblaze", "--shape", "qwen9")
    assert "--routing: 'hot'" in refused(capsys, "--impl", "moeblaze", "--shape", "qwen3-30b-a3b", "--routing", "hot")
    assert "--tokens: 0" in refused(capsys, "--impl", "moeblaze", "--shape", "qwen3-30b-a3b", "--tokens", "0")
    assert "--warmup: 0" in refused(capsys, "--impl", "moeblaze", "--shape", "qwen3-30b-a3b", "--warmup", "0")
