# Loaded by every kernel of the code interpreter (IPython profile startup):
# a pandas DataFrame shown as a cell's result also carries its columns as
# lists under the MIME type e2b/data, which E2B's SDKs read as result.data.
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
