"""The ONNX export without the packages it needs: a `ValueError` naming the package to install."""

import pytest
from hostile import check_api_refusal, without_module

from hf_elmo.convert.to_onnx import export_onnx

API_CASES = {
    # --- export to ONNX ---
    "export_onnx without onnxscript installed": (
        [],
        lambda root: without_module("onnxscript", export_onnx, root / "M", root / "out"),
        r"^--format onnx needs the package onnxscript: pip install 'hf-elmo\[onnx\]'",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)
