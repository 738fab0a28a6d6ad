"""Writes docs/api.md, the Python API reference, from the package's docstrings and signatures.

    python3 tools/api_docs.py            # rewrite docs/api.md
    python3 tools/api_docs.py --check    # exit 1 when docs/api.md differs (python/tests/test_api_docs.py)

It imports the package (the built libmoeblaze_c.so, torch and transformers are needed, no GPU).
A module's public names are its __all__, else the classes and functions it defines whose names
do not start with an underscore; a class lists its public methods and properties too."""
import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api.md"
MODULES = ["moeblaze", "moeblaze.torch", "moeblaze.hf", "moeblaze.torchtitan", "moeblaze.megatron", "moeblaze.ep",
           "moeblaze.ep_experts", "moeblaze.reference"]
# Values have no docstrings of their own.
VALUE_DOCS = {"moeblaze.library_path": "The `libmoeblaze_c.so` this process loaded (a `pathlib.Path`): "
                                       "$MOEBLAZE_LIBRARY, the package's own, or a checkout's build folder."}
HEADER = """# Python API reference

Generated from the docstrings by `python3 tools/api_docs.py`; `python/tests/test_api_docs.py`
fails when this file and the code disagree. The README's "Python use" shows how the pieces fit.
"""


def public_names(module):
    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if not n.startswith("__")]
    return sorted(n for n, v in vars(module).items()
                  if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
                  and getattr(v, "__module__", None) == module.__name__)


def signature(obj):
    """The signature as written in the source: annotations unquoted (the package's modules use
    `from __future__ import annotations`), defaults as they are."""
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    text = re.sub(r"ForwardRef\('([^']*)'\)", r"\1", text)
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", text)


def doc_of(obj):
    return inspect.getdoc(obj) or ""


def members(cls):
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
            target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if doc_of(target):
                out.append((name, value, target))
    return out


def section(module_name, missing):
    module = importlib.import_module(module_name)
    lines = [f"## {module_name}", ""]
    if doc_of(module):
        lines += [doc_of(module), ""]
    for name in public_names(module):
        obj = getattr(module, name)
        qual = f"{module_name}.{name}"
        if inspect.isclass(obj):
            kind = "exception" if issubclass(obj, BaseException) else "class"
            lines += [f"### `{qual}{'' if kind == 'exception' else signature(obj)}`", "", f"*{kind}*", ""]
        elif callable(obj):
            lines += [f"### `{qual}{signature(obj)}`", ""]
        else:
            lines += [f"### `{qual}`", ""]
            if qual not in VALUE_DOCS:
                missing.append(qual)
            lines += [VALUE_DOCS.get(qual, "(undocumented)"), ""]
            continue
        if not doc_of(obj):
            missing.append(qual)
        lines += [doc_of(obj) or "(undocumented)", ""]
        if inspect.isclass(obj):
            for mname, value, target in members(obj):
                head = mname if isinstance(value, property) else f"{mname}{signature(target)}"
                lines += [f"- `{head}`: " + doc_of(target).replace("\n", "\n  "), ""]
    return lines


def render():
    missing = []
    lines = [HEADER]
    lines.append("Modules: " + " · ".join(f"[{m}](#{m.replace('.', '')})" for m in MODULES) + "\n")
    for m in MODULES:
        lines += section(m, missing)
    return "\n".join(lines).rstrip() + "\n", missing


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/api.md instead of writing it")
    a = ap.parse_args()
    text, missing = render()
    if missing:
        print("api_docs: no docstring: " + ", ".join(missing), file=sys.stderr)
    if a.check:
        if not OUT.exists() or OUT.read_text() != text:
            print("api_docs: docs/api.md is not what the docstrings give: run python3 tools/api_docs.py",
                  file=sys.stderr)
            return 1
        return 1 if missing else 0
    OUT.write_text(text)
    print(f"api_docs: wrote {OUT.relative_to(ROOT)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
