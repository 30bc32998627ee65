"""The training engine: the CDC-SSGD driver, the parameter-server baselines, the serial
reference, and the functions they run on Dask workers."""
