# Loaded by every kernel of the code interpreter (IPython profile startup).
#
# DataFrames: a pandas DataFrame shown as a cell's result also carries its
# columns as lists under the MIME type e2b/data, which E2B's SDKs read as
# result.data.
def _codeinterp_register():
    import math
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def plain(v, pd):
        if isinstance(v, pd.Timestamp):
            return v.isoformat()
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if hasattr(v, "item"):
            return plain(v.item(), pd)
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        return str(v)

    class DataFrameColumns(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            # Only a DataFrame, and only if pandas is loaded already: other
            # results must not pay for importing it.
            pd = sys.modules.get("pandas")
            if pd is None or not isinstance(obj, pd.DataFrame):
                return super().__call__(obj)
            return {str(k): [plain(v, pd) for v in col] for k, col in obj.to_dict(orient="list").items()}

    shell = get_ipython()
    if shell is not None:
        f = shell.display_formatter
        f.formatters["e2b/data"] = DataFrameColumns(parent=f)


_codeinterp_register()
del _codeinterp_register


def _codeinterp_charts():
    # Charts: a matplotlib Figure, when displayed (plt.show() or a Figure
    # as the cell's value), also carries what it plots as JSON under the
    # MIME type e2b/chart, which E2B's SDKs read as result.chart: one of
    # line, scatter, bar, pie, box_and_whisker, superchart (a figure of
    # several axes) or unknown, with its title, axis labels, units, scales,
    # ticks and elements. Nothing is imported until a figure is shown.
    import math
    import re
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    # A box plot's numbers are gone once drawn (only lines remain), so
    # Axes.bxp is wrapped when matplotlib loads it and keeps its input
    # statistics on the axes.
    boxes_attr = "_codeinterp_boxes"

    def wrap_bxp(axes_cls):
        orig = axes_cls.bxp
        if getattr(orig, "_codeinterp", False):
            return

        def bxp(self, bxpstats, *args, **kwargs):
            stats = [dict(s) for s in bxpstats]
            artists = orig(self, stats, *args, **kwargs)
            self.__dict__.setdefault(boxes_attr, []).append((stats, artists))
            return artists

        bxp._codeinterp = True
        bxp.__doc__ = orig.__doc__
        axes_cls.bxp = bxp

    class AxesHook:
        # A meta path finder that wraps the loader of matplotlib's Axes
        # module; every other import passes by.
        name = "matplotlib.axes._axes"

        def find_spec(self, name, path=None, target=None):
            if name != self.name:
                return None
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                try:
                    wrap_bxp(module.Axes)
                except Exception:
                    pass

            spec.loader.exec_module = exec_module
            return spec

    if AxesHook.name in sys.modules:
        wrap_bxp(sys.modules[AxesHook.name].Axes)
    else:
        sys.meta_path.insert(0, AxesHook())

    def num(v):
        # JSON has no NaN or infinity; numpy scalars become Python's.
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float):
            if not math.isfinite(v):
                return None
            # 15 significant digits: 0.1 + 0.2 is 0.3, 1e-12 stays.
            return float("%.15g" % v)
        return v

    unit_re = re.compile(r"[(\[]([^()\[\]]+)[)\]]\s*$")

    def label_unit(text):
        if not text:
            return None, None
        m = unit_re.search(text)
        return text, (m.group(1).strip() if m else None)

    def position_label(axis, v):
        # A bar's or box's place as its axis names it: a category, a date,
        # or a number written as short as it is (2, not 2.0).
        v = axis.value(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return None if v is None else str(v)

    def text_or_none(s):
        return s if s else None

    def series_label(artist):
        label = artist.get_label()
        if not label or label.startswith("_"):
            return None
        return label

    class AxisInfo:
        def __init__(self, axis):
            from matplotlib import category, dates

            self.axis = axis
            locator = axis.get_major_locator()
            if isinstance(locator, dates.DateLocator) or isinstance(axis.get_major_formatter(), (dates.AutoDateFormatter, dates.ConciseDateFormatter, dates.DateFormatter)):
                self.scale = "datetime"
            elif isinstance(locator, category.StrCategoryLocator):
                self.scale = "categorical"
            else:
                self.scale = axis.get_scale()

        def value(self, v):
            # A plotted coordinate as the caller gave it: an ISO date, a
            # category's name or a number.
            v = num(v)
            if v is None:
                return None
            if self.scale == "datetime":
                from matplotlib import dates

                return dates.num2date(v).isoformat()
            if self.scale == "categorical":
                return str(self.axis.get_major_formatter()(v))
            return v

        def ticks(self):
            lo, hi = sorted(self.axis.get_view_interval())
            locs = [t for t in self.axis.get_majorticklocs() if lo <= t <= hi]
            try:
                labels = [str(s) for s in self.axis.get_major_formatter().format_ticks(locs)]
            except Exception:
                labels = [str(num(t)) for t in locs]
            return [self.value(t) for t in locs], labels

    def chart2d(ax, kind, elements):
        x_label, x_unit = label_unit(ax.get_xlabel())
        y_label, y_unit = label_unit(ax.get_ylabel())
        return {"type": kind, "title": axes_title(ax), "x_label": x_label, "y_label": y_label,
                "x_unit": x_unit, "y_unit": y_unit, "elements": elements}

    def axes_title(ax):
        for loc in ("center", "left", "right"):
            t = ax.get_title(loc)
            if t:
                return t
        return None

    def box_chart(ax, records):
        x, y = AxisInfo(ax.xaxis), AxisInfo(ax.yaxis)
        elements = []
        for stats, artists in records:
            vertical = True
            if artists.get("medians"):
                xs = artists["medians"][0].get_xdata()
                vertical = len(xs) > 1 and xs[0] != xs[-1]
            pos_axis = x if vertical else y
            meds = artists.get("medians") or []
            for i, s in enumerate(stats):
                label = s.get("label")
                if label is None and i < len(meds):
                    data = meds[i].get_xdata() if vertical else meds[i].get_ydata()
                    label = position_label(pos_axis, (data[0] + data[-1]) / 2)
                elements.append({"label": None if label is None else str(label), "min": num(s["whislo"]),
                                 "first_quartile": num(s["q1"]), "median": num(s["med"]),
                                 "third_quartile": num(s["q3"]), "max": num(s["whishi"]),
                                 "outliers": [num(v) for v in s.get("fliers", [])]})
        return chart2d(ax, "box_and_whisker", elements)

    def bar_chart(ax, containers):
        x, y = AxisInfo(ax.xaxis), AxisInfo(ax.yaxis)
        elements = []
        for c in containers:
            horizontal = getattr(c, "orientation", None) == "horizontal"
            values = getattr(c, "datavalues", None)
            for i, rect in enumerate(c.patches):
                if horizontal:
                    where, value, pos_axis = rect.get_y() + rect.get_height() / 2, rect.get_width(), y
                else:
                    where, value, pos_axis = rect.get_x() + rect.get_width() / 2, rect.get_height(), x
                if values is not None and i < len(values):
                    value = values[i]
                elements.append({"label": position_label(pos_axis, where), "value": num(value), "group": series_label(c)})
        return chart2d(ax, "bar", elements)

    def pie_chart(ax, wedges):
        elements = [{"label": series_label(w), "angle": num(round(abs(w.theta2 - w.theta1), 4)), "radius": num(w.r)} for w in wedges]
        return {"type": "pie", "title": axes_title(ax), "elements": elements}

    def point_chart(ax, kind, series):
        x, y = AxisInfo(ax.xaxis), AxisInfo(ax.yaxis)
        out = chart2d(ax, kind, [])
        x_ticks, x_tick_labels = x.ticks()
        y_ticks, y_tick_labels = y.ticks()
        out.update({"x_scale": x.scale, "y_scale": y.scale, "x_ticks": x_ticks, "x_tick_labels": x_tick_labels,
                    "y_ticks": y_ticks, "y_tick_labels": y_tick_labels})
        import numpy as np

        for artist, xy in series:
            # Masked coordinates (a scatter's NaNs) are NaN, so null.
            xy = np.ma.filled(np.ma.asarray(xy, dtype=float), np.nan)
            out["elements"].append({"label": series_label(artist),
                                    "points": [[x.value(p[0]), y.value(p[1])] for p in xy]})
        return out

    def axes_chart(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.container import BarContainer
        from matplotlib.patches import Wedge

        # Box plots still drawn on the axes (ax.cla() drops them).
        lines = list(ax.lines)
        records = [r for r in ax.__dict__.get(boxes_attr, []) if any(m in lines for m in r[1].get("medians", []))]
        if records:
            return box_chart(ax, records)
        patches = list(ax.patches)
        wedges = [p for p in patches if isinstance(p, Wedge)]
        if wedges and len(wedges) == len(patches):
            return pie_chart(ax, wedges)
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        if bars:
            return bar_chart(ax, bars)
        lines = [(l, l.get_xydata()) for l in lines]
        points = [(c, c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)]
        if lines:
            return point_chart(ax, "line", lines + points)
        if points:
            return point_chart(ax, "scatter", points)
        return {"type": "unknown", "title": axes_title(ax), "elements": []}

    def figure_chart(fig):
        suptitle = getattr(fig, "_suptitle", None)
        suptitle = text_or_none(suptitle.get_text()) if suptitle is not None else None
        axes = [ax for ax in fig.get_axes() if ax.get_visible() and not hasattr(ax, "_colorbar")]
        if len(axes) == 1:
            chart = axes_chart(axes[0])
            if chart.get("title") is None:
                chart["title"] = suptitle
            return chart
        if not axes:
            return {"type": "unknown", "title": suptitle, "elements": []}
        return {"type": "superchart", "title": suptitle, "elements": [axes_chart(ax) for ax in axes]}

    def figure_to_chart(fig):
        # A chart that cannot be read is left out, never an error in the cell.
        try:
            return figure_chart(fig)
        except Exception:
            return None

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            # Checked here rather than registered for the type: IPython
            # drops every formatter's Figure entry when matplotlib's inline
            # backend starts.
            mod = sys.modules.get("matplotlib.figure")
            if mod is not None and isinstance(obj, mod.Figure):
                return figure_to_chart(obj)
            return super().__call__(obj)

    shell = get_ipython()
    if shell is not None:
        f = shell.display_formatter
        f.formatters["e2b/chart"] = ChartFormatter(parent=f)


_codeinterp_charts()
del _codeinterp_charts
