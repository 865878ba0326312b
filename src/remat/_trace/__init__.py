"""Reading and rewriting traced programs: walking jaxprs, finding scans (`ScanInfo`),
rewriting them with a strategy (`remat.apply`), naming their values for the planner, and
reading checkpoints. May import `_core` and `_scan`.
"""
