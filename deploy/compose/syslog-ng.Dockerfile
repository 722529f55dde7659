# syslog-ng collector image for the compose stack: Debian 12's syslog-ng 3.38 + rdkafka module (the versions
# the configs are tested with), our config template, heartbeat generator and renderer.
#   docker build -f deploy/compose/syslog-ng.Dockerfile -t forumpulse-syslog-ng:0.1.0 .
FROM debian:12.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends syslog-ng-core syslog-ng-mod-rdkafka procps \
 && rm -rf /var/lib/apt/lists/*

COPY syslog-ng/forumpulse.conf syslog-ng/heartbeat.sh /usr/share/forumpulse/syslog-ng/
COPY deploy/syslog-ng/syslogng.sh /usr/share/forumpulse/syslogng.sh
COPY deploy/compose/syslog-ng-entrypoint.sh /usr/local/bin/forumpulse-syslog-ng
RUN chmod 0755 /usr/share/forumpulse/syslog-ng/heartbeat.sh /usr/local/bin/forumpulse-syslog-ng \
 && mkdir -p /var/lib/forumpulse/syslog-ng

EXPOSE 5140/tcp 5140/udp 5514/tcp 5514/udp 5515/tcp 5515/udp
ENTRYPOINT ["/usr/local/bin/forumpulse-syslog-ng"]
