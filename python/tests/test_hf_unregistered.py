"""What a user sees who asks transformers for experts_implementation="moeblaze" without
`import moeblaze.hf`: transformers' own ValueError naming the value, raised from a fixed list
of registered names (PreTrainedModel.get_correct_experts_implementation) with no hook through
which moeblaze could add "import moeblaze.hf" (the README says so). A transformers that gains
such a hook, or changes the message, fails here. Run in a fresh interpreter, since this
process has imported moeblaze.hf elsewhere. Skipped without torch or transformers."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

CHILD = r"""
import sys, transformers
sys.path.insert(0, sys.argv[1])
from hf_configs import small_config
try:
    transformers.AutoModelForCausalLM.from_config(small_config("qwen3_moe"), experts_implementation="moeblaze")
except ValueError as e:
    print("ValueError:", e)
else:
    print("built")
print("moeblaze.hf imported:", "moeblaze.hf" in sys.modules)
"""


def test_unregistered_backend_gets_transformers_fixed_message():
    out = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'ValueError: Specified `experts_implementation="moeblaze"` is not supported' in out.stdout, out.stdout
    assert '"grouped_mm"' in out.stdout  # the registered names are listed; "import moeblaze.hf" cannot be
    assert "moeblaze.hf imported: False" in out.stdout
