"""The web page's image heatmap (clients/web/static/attention.js) under Node with a minimal stand-in DOM: each
cell shades by its own attention column, also when a ViT's "cls" column comes before the cells
(`columns.first`). Skipped without node. The browser tests (test_web_browser.py) need Playwright."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

STATIC = pathlib.Path(__file__).resolve().parents[1] / "clients" / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

# Just enough DOM for show() and pin(): elements by id, created elements, children, dataset, style, classes.
HARNESS = """
class El {
  constructor(tag) { this.tag = tag; this.children = []; this.dataset = {}; this.hidden = false;
    this.style = { setProperty: (k, v) => { this.style[k] = v; } }; this.classList = new Set();
    this.classList.toggle = (c, on) => { (on ?? !this.classList.has(c)) ? this.classList.add(c) : this.classList.delete(c); };
    this.textContent = ""; }
  replaceChildren(...c) { this.children = c; }
  append(...c) { this.children.push(...c); }
  setAttribute(k, v) { this[k] = v; }
  addEventListener() {}
  focus() {}
  querySelectorAll() { return []; }
  closest() { return null; }
}
const byId = {};
globalThis.document = { getElementById: (id) => (byId[id] ??= new El("div")), createElement: (t) => new El(t) };
const { show, pin } = await import("./attention.js");
const result = JSON.parse(process.argv[2]);
show(result, { url: "x.png", width: 224, height: 224 });
pin(Number(process.argv[3]));
const cells = byId["cells"].children;
console.log(JSON.stringify(cells.map((c) => [Number(c.dataset.col), Number(c.dataset.weight)])));
"""


def run_page(tmp_path, result: dict, row: int) -> list[list[float]]:
    for name in ("attention.js", "matrix.js"):
        shutil.copy(STATIC / name, tmp_path / name)
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "harness.js").write_text(HARNESS)
    out = subprocess.run([NODE, "harness.js", json.dumps(result), str(row)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def grid_result(weights, labels, columns) -> dict:
    return {"attention": {"weights": weights, "row_labels": ["a", "b"][: len(weights)], "col_labels": labels,
                          "reduction": "mean"},
            "columns": columns, "tokens": [], "words": [], "glossary_rows": [], "frames": []}


@pytest.mark.parametrize("first", [0, 1])
def test_each_cell_shades_by_its_own_column(tmp_path, first):
    cells = ["r0c0:0,0,112,112", "r0c1:112,0,224,112", "r1c0:0,112,112,224", "r1c1:112,112,224,224"]
    labels = ["cls"] * first + cells
    weights = [[0.5] * first + [0.1, 0.2, 0.15, 0.05], [0.1] * first + [0.3, 0.1, 0.2, 0.3]]
    columns = {"kind": "grid", "boxes": [[0, 0, 112, 112], [112, 0, 224, 112], [0, 112, 112, 224],
                                         [112, 112, 224, 224]], **({"first": first} if first else {})}
    for row in (0, 1):
        shaded = run_page(tmp_path, grid_result(weights, labels, columns), row)
        assert [col for col, _ in shaded] == [first + j for j in range(4)]
        assert [w for _, w in shaded] == pytest.approx(weights[row][first:])
