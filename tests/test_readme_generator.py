"""The README generator fills its marked sections, empty ones included, and is idempotent."""

from experiments.readme import fill_sections


def test_fills_empty_and_existing_sections_and_is_idempotent():
    text = "a\n<!-- BEGIN:one -->\n<!-- END:one -->\nb\n<!-- BEGIN:two -->\nold\nlines\n<!-- END:two -->\nc\n"
    sections = {"one": lambda: "ONE", "two": lambda: "TWO\nrows", "absent": lambda: "never"}
    once = fill_sections(text, sections)
    assert once == "a\n<!-- BEGIN:one -->\nONE\n<!-- END:one -->\nb\n<!-- BEGIN:two -->\nTWO\nrows\n<!-- END:two -->\nc\n"
    assert fill_sections(once, sections) == once


def test_a_missing_results_file_is_said_not_hidden():
    def missing():
        raise FileNotFoundError("results/nosuch.md")

    out = fill_sections("<!-- BEGIN:x -->\n<!-- END:x -->\n", {"x": missing})
    assert "(not generated yet: results/nosuch.md)" in out
