"""Driver side: the Spark session, one streaming query per subscription, and the micro-batch handler."""
