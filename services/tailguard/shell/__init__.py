"""The Kafka shell shared by the five services: a faust-streaming app around a pure core."""
