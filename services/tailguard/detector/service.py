"""The detector service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell.definition import ServiceDefinition

DEFINITION = ServiceDefinition(name="detector", input_topic=EVENTS_TOPIC, core=SlowTaskDetector)
