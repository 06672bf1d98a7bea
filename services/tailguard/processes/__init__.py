"""The processes tailguard starts and supervises: the embedded broker, the services and the local
Spark cluster's daemons (`supervised`), and the process trees below them (`trees`)."""
