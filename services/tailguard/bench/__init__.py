"""`tailguard bench`: tailguard against plain PySpark and Spark's speculation, side by side."""
