# The matplotlib backend of /run_jupyter's driver: figures render with
# Agg, and plt.show() hands the open figures to the running cell's
# displays (as PNGs) instead of opening a window.
import sys

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args, **kwargs):
    driver = sys.modules.get("__main__")
    if hasattr(driver, "show_figures"):
        driver.show_figures()
