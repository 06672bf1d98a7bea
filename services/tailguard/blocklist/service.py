"""The blocklist service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.records import FINDINGS_TOPIC
from tailguard.shell.definition import ServiceDefinition

DEFINITION = ServiceDefinition(name="blocklist", input_topic=FINDINGS_TOPIC, core=BlocklistTracker)
