"""The speculator service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.model.records import FINDINGS_TOPIC
from tailguard.shell.definition import ServiceDefinition
from tailguard.speculator.policy import SpeculationStrategy

DEFINITION = ServiceDefinition(
    name="speculator", input_topic=FINDINGS_TOPIC, core=SpeculationStrategy
)
