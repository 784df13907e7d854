#!/bin/sh
# Elastic host discovery for one machine: two slots under two names of this host.
# Horovod's elastic driver blacklists the whole *host* of a worker that fails; listed as
# localhost:2, one killed worker would take both slots with it and stop the job.
echo localhost:1
echo 127.0.0.1:1
