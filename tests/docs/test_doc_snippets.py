"""Every shell command and Python snippet of the docs and READMEs runs here, or says why not.

tools/doc_snippets.py parses the pages (docs/*.md, docs/guides/*.md, the READMEs,
DEVELOPERS.md) into fenced blocks. An unmarked ``python`` / ``bash`` / ``sh`` / ``shell`` /
``console`` block runs (the blocks of one page in order, in one temporary directory); a block
that cannot run here carries ``<!-- snippet: skip: <reason> -->`` or
``<!-- snippet: covered-by <test> -->`` on the line before its fence (docs/contributing.md,
"Code blocks in the docs").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS_DIR = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS_DIR) not in sys.path:
    sys.path.insert(0, str(TOOLS_DIR))

import doc_snippets  # noqa: E402
from doc_snippets import Block, Mark, MarkError, parse_mark, parse_page  # noqa: E402

PAGES = doc_snippets.pages()


def page_id(path: Path) -> str:
    return path.relative_to(doc_snippets.REPO_ROOT).as_posix()


def all_blocks() -> list[Block]:
    return [block for path in PAGES for block in parse_page(path)]


def test_pages_are_found() -> None:
    names = {page_id(path) for path in PAGES}
    for expected in ("README.md", "DEVELOPERS.md", "docs/cli.md", "docs/guides/algos.md"):
        assert expected in names
    assert any(name.startswith("packages/") for name in names)
    assert any(name.startswith("recipes/") for name in names)
    assert sum(block.language in doc_snippets.RUN_LANGUAGES for block in all_blocks()) >= 100


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_every_mark_is_well_formed_and_on_a_code_block(path: Path) -> None:
    """parse_page raises on a malformed mark or one that is not right before a fence; every
    mark in the text belongs to exactly one block (none left on a prose line)."""
    blocks = parse_page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    marks_in_text = sum(bool(doc_snippets.MARK_LINE.match(line)) for line in lines)
    marked = [block for block in blocks if block.mark.kind != "run"]
    assert marks_in_text == len(marked), f"{page_id(path)}: a snippet mark on no code block"
    for block in marked:
        assert block.language in doc_snippets.RUN_LANGUAGES, block.where


def test_every_covered_by_target_exists() -> None:
    missing = [
        f"{block.where}: {target}"
        for block in all_blocks()
        if block.mark.kind == "covered-by"
        for target in doc_snippets.missing_tests(block.mark.value)
    ]
    assert not missing, "covered-by names no such test:\n" + "\n".join(missing)


def test_blocks_that_are_not_run_still_parse() -> None:
    errors = [
        error
        for block in all_blocks()
        if block.language in doc_snippets.RUN_LANGUAGES and not block.runs
        for error in [doc_snippets.syntax_error(block)]
        if error
    ]
    assert not errors, "\n".join(errors)


RUN_PAGES = [path for path in PAGES if any(block.runs for block in parse_page(path))]


@pytest.mark.timeout(1800)  # several blocks, each bounded by doc_snippets.DEFAULT_TIMEOUT_S
@pytest.mark.parametrize("path", RUN_PAGES, ids=page_id)
def test_page_blocks_run(path: Path, tmp_path: Path) -> None:
    """The page's runnable blocks, in order, in one working directory; the first failure
    names the page and line of its block."""
    for block in parse_page(path):
        if block.runs:
            outcome = doc_snippets.run_block(block, tmp_path)
            assert outcome.ok, outcome.report()


# -- the parser itself, on made-up pages --------------------------------------------------


def write_page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_marks_blocks_and_languages(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        "# Title\n\n```python\nprint(1)\n```\n\n"
        "<!-- snippet: skip: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        "1. In a list:\n\n"
        "   <!-- snippet: file my_reward.py -->\n   ```python\n   x = 1\n   ```\n\n"
        "```yaml\na: 1\n```\n\n"
        "<!-- snippet: covered-by tests/a.py::test_one packages/p/tests/b.py::test_two -->\n"
        "````console\n$ hybridflow --help\nusage: ...\n````\n",
    )
    blocks = parse_page(page, root=tmp_path)
    assert [(b.line, b.language, b.mark.kind) for b in blocks] == [
        (3, "python", "run"),
        (8, "bash", "skip"),
        (15, "python", "file"),
        (19, "yaml", "run"),
        (24, "console", "covered-by"),
    ]
    assert blocks[1].mark == Mark("skip", "needs a GPU")
    assert blocks[2].code == "x = 1\n" and blocks[2].mark.value == "my_reward.py"
    assert not blocks[3].runs
    assert doc_snippets.shell_code(blocks[4]) == "hybridflow --help\n"
    assert blocks[4].where == "page.md:24"


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        ("<!-- snippet: skip: -->", "needs a reason"),
        ("<!-- snippet: skip -->", "unknown snippet mark"),
        ("<!-- snippet: run later -->", "unknown snippet mark"),
        ("<!-- snippet: covered-by test_quickstart -->", "covered-by"),
        ("<!-- snippet: covered-by tests/x.py -->", "covered-by"),
        ("<!-- snippet: file ../escape.py -->", "plain file name"),
    ],
)
def test_malformed_marks_are_refused(mark: str, message: str) -> None:
    with pytest.raises(MarkError, match=message):
        parse_mark(mark)


@pytest.mark.parametrize(
    "text",
    [
        "<!-- snippet: skip: stale -->\n\nSome prose.\n",
        "<!-- snippet: skip: stale -->\n\n```python\nx = 1\n```\n",
        "<!-- snippet: skip: on yaml -->\n```yaml\na: 1\n```\n",
    ],
    ids=["on-prose", "blank-line-before-fence", "on-a-block-never-run"],
)
def test_misplaced_marks_are_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(MarkError):
        parse_page(write_page(tmp_path, text), root=tmp_path)


def test_missing_tests_are_named(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    targets = "tests/test_a.py::test_one tests/test_a.py::test_two tests/test_b.py::test_one"
    assert doc_snippets.missing_tests(targets, root=tmp_path) == [
        "tests/test_a.py::test_two",
        "tests/test_b.py::test_one",
    ]


def test_a_failing_block_names_its_page_and_line(tmp_path: Path) -> None:
    block = Block("docs/x.md", 12, "bash", "echo hello\nfalse\necho never\n", Mark("run"))
    outcome = doc_snippets.run_block(block, tmp_path)
    assert not outcome.ok
    assert "hello" in outcome.output and "never" not in outcome.output
    assert outcome.report().startswith("docs/x.md:12: bash block exited 1")


def test_blocks_run_with_the_dev_environment_and_a_timeout(tmp_path: Path) -> None:
    shell = Block("p.md", 1, "bash", "command -v python hybridflow > where.txt\n", Mark("run"))
    assert doc_snippets.run_block(shell, tmp_path).ok
    venv_bin = str(Path(sys.executable).parent)
    assert all(line.startswith(venv_bin) for line in (tmp_path / "where.txt").read_text().split())
    slow = Block("p.md", 5, "python", "import time\ntime.sleep(30)\n", Mark("run"))
    outcome = doc_snippets.run_block(slow, tmp_path, timeout_s=1)
    assert outcome.returncode == 124 and "timed out" in outcome.output
