"""Runs a test under the repository's virtual environment (.venv/, made by
`scripts/install-deps.sh test` from scripts/requirements-test.txt) when it needs a package from
PyPI: Hugging Face tokenizers or transformers, safetensors, TensorBoard's reader.

A test calls reexec_in_venv() before importing them. A missing environment is an error that says
how to make it, never a skip: CI installs it, and a test that silently does not run proves nothing.
"""
import os
import sys


def venv_python(name=".venv"):
    root = os.environ.get("ZTRAIN_SOURCE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if name == ".venv" and os.environ.get("ZTRAIN_VENV_PYTHON"):
        return os.environ["ZTRAIN_VENV_PYTHON"]
    return os.path.join(root, name, "bin", "python")


def reexec_in_venv(name=".venv", how="scripts/install-deps.sh test"):
    """Re-executes the test under the environment `name` at the repository root (.venv-ds, made
    by `scripts/install-deps.sh deepspeed`, holds DeepSpeed and transformers 5)."""
    py = venv_python(name)
    if os.path.realpath(sys.prefix) == os.path.realpath(os.path.dirname(os.path.dirname(py))):
        return
    if not os.path.exists(py):
        sys.exit(f"{os.path.basename(sys.argv[0])}: {py} is missing; "
                 f"run `{how}` to make the test environment")
    os.execv(py, [py] + sys.argv)
