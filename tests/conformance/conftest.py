"""Prints the conformance pass count and the newly passing cases after the run."""


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    mod = sys.modules.get("tests.conformance.test_onnx_backend")
    if mod is None or not mod.RESULTS:
        return
    passed = {n for n, ok in mod.RESULTS.items() if ok}
    node = sum(1 for n in passed if mod.CASES[n].kind == "node")
    light = sum(1 for n in passed if mod.CASES[n].kind == "light")
    write = terminalreporter.write_line
    write(f"ONNX conformance (cpu): {len(passed)} of {len(mod.RESULTS)} run cases pass")
    write(f"  node tests {node}, light models {light}; expected list {len(mod.EXPECTED)}")
    for n in sorted(passed - mod.EXPECTED):
        write(f"  newly passing: {n}")
