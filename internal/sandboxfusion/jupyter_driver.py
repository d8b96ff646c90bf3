# The /run_jupyter driver: runs the cells of one call one after another in
# one namespace, as a notebook's kernel does. A cell sees what the cells
# before it defined; the value of its last expression and each display()
# are its displays, as Jupyter's data bundles ({"text/plain": repr,
# "text/html": ..., "image/png": base64, ...} from the object's _repr_*_
# methods); each matplotlib figure shown (plt.show(), or open at the end
# of the cell) is a display with its PNG; an exception is its error
# ({ename, evalue, traceback}) and the next cell still runs. It writes the
# cells' results as JSON to the file named by its second argument.
import ast
import base64
import contextlib
import io
import json
import os
import signal
import sys
import traceback

# Figures render with Agg; the backend beside this file hands plt.show()'s
# figures to show_figures. Files sent with the call import from the cwd.
os.environ["MPLBACKEND"] = "module://sandboxfusion_inline"
sys.path[0:1] = ["", os.path.dirname(os.path.abspath(__file__))]

REPRS = [("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"), ("_repr_svg_", "image/svg+xml"),
         ("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"), ("_repr_pdf_", "application/pdf"),
         ("_repr_latex_", "text/latex"), ("_repr_json_", "application/json"),
         ("_repr_javascript_", "application/javascript")]
BINARY = {"image/png", "image/jpeg", "application/pdf"}

cfg = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__", "__builtins__": __builtins__}
current = {"display": [], "shown": set()}


def figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def is_figure(v):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(v, mod.Figure)


def bundle(v):
    data = {}
    if not isinstance(v, type):
        mb = getattr(v, "_repr_mimebundle_", None)
        if callable(mb):
            try:
                r = mb()
                r = r[0] if isinstance(r, tuple) else r
                if isinstance(r, dict):
                    data.update(r)
            except Exception:
                pass
        for meth, mime in REPRS:
            f = getattr(v, meth, None)
            if mime in data or not callable(f):
                continue
            try:
                r = f()
            except Exception:
                continue
            r = r[0] if isinstance(r, tuple) else r
            if r is None:
                continue
            if mime in BINARY and isinstance(r, bytes):
                r = base64.b64encode(r).decode()
            data[mime] = r
        if is_figure(v):
            data["image/png"] = figure_png(v)
            current["shown"].add(id(v))
    data["text/plain"] = repr(v)
    for k in list(data):
        try:
            json.dumps(data[k])
        except (TypeError, ValueError):
            data[k] = str(data[k])
    return data


def display(*objs, **kwargs):
    for o in objs:
        current["display"].append(bundle(o))


def show_figures():
    # Each open pyplot figure not shown yet in this cell, then closed, as
    # Jupyter's inline backend does.
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        if id(fig) not in current["shown"]:
            current["display"].append({"text/plain": repr(fig), "image/png": figure_png(fig)})
    plt.close("all")
    current["shown"].clear()


ns["display"] = display


class CellTimeout(Exception):
    pass


def alarm(signum, frame):
    raise CellTimeout("the cell ran past cell_timeout")


def main():
    signal.signal(signal.SIGALRM, alarm)
    cells = []
    for i, src in enumerate(cfg["cells"]):
        r = {"stdout": "", "stderr": "", "display": [], "error": []}
        current["display"], current["shown"] = r["display"], set()
        out, err = io.StringIO(), io.StringIO()
        name = "<cell %d>" % (i + 1)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if cfg["cell_timeout"] > 0:
                    signal.setitimer(signal.ITIMER_REAL, cfg["cell_timeout"])
                try:
                    tree = ast.parse(src, name)
                    last = None
                    if tree.body and isinstance(tree.body[-1], ast.Expr):
                        last = ast.Expression(tree.body.pop().value)
                    exec(compile(tree, name, "exec"), ns)
                    if last is not None:
                        value = eval(compile(last, name, "eval"), ns)
                        # A cell ending in ";" shows no value, as in Jupyter.
                        if value is not None and not src.rstrip().endswith(";"):
                            ns["_"] = value
                            r["display"].append(bundle(value))
                    show_figures()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as e:
            r["error"].append({"ename": type(e).__name__, "evalue": str(e),
                               "traceback": traceback.format_exception(type(e), e, e.__traceback__)})
        r["stdout"], r["stderr"] = out.getvalue(), err.getvalue()
        cells.append(r)
    with open(sys.argv[2], "w") as f:
        json.dump({"cells": cells}, f)


if __name__ == "__main__":
    main()
