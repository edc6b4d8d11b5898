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


def test_generated_headings_nest_under_the_readme_section_they_sit_in():
    """A results file's `# Title` / `## Part` must not open sections of the README: they are moved
    below the README heading above the marker (relative depths kept), code fences untouched, and the
    README's own headings -- not an earlier section's generated ones -- set the level."""
    text = ("# R\n## Results\n<!-- BEGIN:a -->\n<!-- END:a -->\n<!-- BEGIN:b -->\n<!-- END:b -->\n### Deeper\n"
            "<!-- BEGIN:c -->\n<!-- END:c -->\n")
    sections = {"a": lambda: "# Title\ntext\n## Part\n```bash\n# a comment\n```", "b": lambda: "## Only", "c": lambda: "#### Four"}
    out = fill_sections(text, sections)
    assert "### Title\ntext\n#### Part\n```bash\n# a comment\n```" in out
    assert "<!-- BEGIN:b -->\n### Only\n" in out  # under "## Results", not under a's "#### Part"
    assert "<!-- BEGIN:c -->\n#### Four\n" in out  # already below "### Deeper": unchanged
    assert fill_sections(out, sections) == out
