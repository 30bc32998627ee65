"""dcoded: coded synchronous SGD (CDC-SSGD) on Dask, measured to the byte."""

__version__ = "0.1.0"
