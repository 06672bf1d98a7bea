"""The failover service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.failover.policy import FailoverStrategy
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell.definition import ServiceDefinition

DEFINITION = ServiceDefinition(name="failover", input_topic=EVENTS_TOPIC, core=FailoverStrategy)
