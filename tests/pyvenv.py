"""Runs a test under the repository's virtual environment (.venv/, made by
`scripts/install-deps.sh test` from scripts/requirements-test.txt) when it needs a package from
PyPI: Hugging Face tokenizers or transformers, safetensors, TensorBoard's reader.

A test calls reexec_in_venv() before importing them. A missing environment is an error that says
how to make it, never a skip: CI installs it, and a test that silently does not run proves nothing.
"""
import os
import sys


def venv_python():
    root = os.environ.get("ZTRAIN_SOURCE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.environ.get("ZTRAIN_VENV_PYTHON") or os.path.join(root, ".venv", "bin", "python")


def reexec_in_venv():
    py = venv_python()
    if os.path.realpath(sys.prefix) == os.path.realpath(os.path.dirname(os.path.dirname(py))):
        return
    if not os.path.exists(py):
        sys.exit(f"{os.path.basename(sys.argv[0])}: {py} is missing; "
                 "run `scripts/install-deps.sh test` to make the test environment")
    os.execv(py, [py] + sys.argv)
