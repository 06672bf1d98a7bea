"""The plain PySpark application the spark-submit tests submit: no tailguard in its code."""

SUBMITTED_JOB = """
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.appName("plain-job").getOrCreate()
spark.range(0, 100_000).withColumn("k", F.col("id") % 7).groupBy("k").agg(F.sum("id")).collect()
spark.stop()
"""
