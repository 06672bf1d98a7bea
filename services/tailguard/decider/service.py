"""The decider service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.decider.policy import ParallelismDecider
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell.definition import ServiceDefinition

DEFINITION = ServiceDefinition(name="decider", input_topic=EVENTS_TOPIC, core=ParallelismDecider)
