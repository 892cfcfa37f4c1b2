"""The imperative shell: Kafka clients, topic administration and worker services."""
