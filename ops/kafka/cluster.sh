# shellcheck shell=bash
# ops/kafka/cluster.sh: a local three-broker Kafka cluster (KRaft, every node broker and
# controller, static quorum of three), for replication and failover: topics with three
# replicas and min.insync.replicas 2, and a broker that can be killed. Sourced by ops/stack,
# whose helpers it uses (the jars, probes, waits and pid checks are the single broker's):
#
#   ops/stack up kafka-cluster | down kafka-cluster | status kafka-cluster | env kafka-cluster
#
# Ports (127.0.0.1, PLAINTEXT only), node N = 1..3:
#   broker      MEMPROJ_KAFKA_CLUSTER_PORT + N - 1             (29092..29094)
#   controller  MEMPROJ_KAFKA_CLUSTER_CONTROLLER_PORT + N - 1  (29192..29194)
# State in <stack>/kafka-cluster/broker-N/ (data, server.properties, kafka.pid), logs in
# <stack>/logs/kafka-cluster/broker-N/. MEMPROJ_KAFKA_CLUSTER_HEAP is each JVM's -Xmx (384m).

KAFKA_CLUSTER_NODES=(1 2 3)
KAFKA_CLUSTER_PORT=${MEMPROJ_KAFKA_CLUSTER_PORT:-29092}
KAFKA_CLUSTER_CONTROLLER_PORT=${MEMPROJ_KAFKA_CLUSTER_CONTROLLER_PORT:-29192}
KAFKA_CLUSTER_HEAP=(-Xms128m "-Xmx${MEMPROJ_KAFKA_CLUSTER_HEAP:-384m}")
KAFKA_CLUSTER_HOME=$STACK_DIR/kafka-cluster
KAFKA_CLUSTER_LOG_DIR=$LOG_DIR/kafka-cluster
KAFKA_CLUSTER_TEMPLATE=$OPS_DIR/kafka/cluster.properties
# What memproj's topics get on this cluster (`ops/stack env kafka-cluster`).
KAFKA_CLUSTER_REPLICATION_FACTOR=3
KAFKA_CLUSTER_MIN_INSYNC_REPLICAS=2

cluster_port() { echo $((KAFKA_CLUSTER_PORT + $1 - 1)); }
cluster_controller_port() { echo $((KAFKA_CLUSTER_CONTROLLER_PORT + $1 - 1)); }
cluster_node_dir() { echo "$KAFKA_CLUSTER_HOME/broker-$1"; }
cluster_props() { echo "$(cluster_node_dir "$1")/server.properties"; }
cluster_pid_file() { echo "$(cluster_node_dir "$1")/kafka.pid"; }
cluster_server_log() { echo "$KAFKA_CLUSTER_LOG_DIR/broker-$1/server.log"; }

cluster_bootstrap() {
    local n list=()
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do list+=("127.0.0.1:$(cluster_port "$n")"); done
    (IFS=,; printf '%s\n' "${list[*]}")
}

cluster_voters() {
    local n list=()
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do list+=("$n@127.0.0.1:$(cluster_controller_port "$n")"); done
    (IFS=,; printf '%s\n' "${list[*]}")
}

cluster_pid() {  # NODE: the pid of that node's JVM, if it runs
    local pid
    pid=$(read_pid "$(cluster_pid_file "$1")") && pid_cmdline_has "$pid" "$(cluster_props "$1")" && echo "$pid"
}

cluster_render_config() {  # NODE
    local n=$1 props
    props=$(cluster_props "$n")
    sed -e "s|@NODE_ID@|$n|g" \
        -e "s|@PORT@|$(cluster_port "$n")|g" \
        -e "s|@CONTROLLER_PORT@|$(cluster_controller_port "$n")|g" \
        -e "s|@VOTERS@|$(cluster_voters)|g" \
        -e "s|@LOG_DIRS@|$(sed_escape "$(cluster_node_dir "$n")/data")|g" \
        "$KAFKA_CLUSTER_TEMPLATE" > "$props.tmp"
    mv -f "$props.tmp" "$props"
}

cluster_format() {  # NODE: every node's storage carries the one cluster id
    local n=$1 dir cid
    dir=$(cluster_node_dir "$n")
    [ -f "$dir/data/meta.properties" ] && return 0
    if [ ! -s "$KAFKA_CLUSTER_HOME/cluster.id" ]; then
        java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid > "$KAFKA_CLUSTER_HOME/cluster.id.tmp" 9>&-
        mv -f "$KAFKA_CLUSTER_HOME/cluster.id.tmp" "$KAFKA_CLUSTER_HOME/cluster.id"
    fi
    cid=$(cat "$KAFKA_CLUSTER_HOME/cluster.id")
    mkdir -p "$dir/data"
    if ! java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$(cluster_props "$n")" \
            >> "$KAFKA_CLUSTER_LOG_DIR/broker-$n/format.log" 2>&1 9>&-; then
        show_log_tail "$KAFKA_CLUSTER_LOG_DIR/broker-$n/format.log"
        die "kafka-cluster: storage format of broker $n failed"
    fi
}

declare -A CLUSTER_LOG_OFFSET=()

cluster_launch() {  # NODE: start the JVM in the background
    local n=$1 logs=$KAFKA_CLUSTER_LOG_DIR/broker-$1
    CLUSTER_LOG_OFFSET[$n]=$(stat -c %s "$(cluster_server_log "$n")" 2>/dev/null || echo 0)
    (
        cd "$(cluster_node_dir "$n")"
        setsid nohup java "${KAFKA_CLUSTER_HEAP[@]}" -server \
            -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExplicitGCInvokesConcurrent \
            -XX:TieredStopAtLevel=1 -Djava.awt.headless=true -Dlog4j2.shutdownHookEnabled=false \
            "-Dkafka.logs.dir=$logs" "-Dlog4j2.configurationFile=$KAFKA_LOG4J" \
            -cp "$KAFKA_LIBS/*" kafka.Kafka "$(cluster_props "$n")" \
            > "$logs/kafka.out" 2>&1 < /dev/null 9>&- &
        echo $! > "$(cluster_pid_file "$n")"
    )
}

cluster_node_ready() {  # NODE: started (logged since its launch, if launched now) and answering
    local n=$1 off size
    if [ -n "${CLUSTER_LOG_OFFSET[$n]:-}" ]; then
        off=${CLUSTER_LOG_OFFSET[$n]}
        size=$(stat -c %s "$(cluster_server_log "$n")" 2>/dev/null || echo 0)
        [ "$size" -ge "$off" ] || off=0
        grep -qF 'Kafka Server started' <(tail -c "+$((off + 1))" "$(cluster_server_log "$n")" 2>/dev/null) || return 1
    fi
    kafka_probe "$(cluster_port "$n")"
}
cluster_ready() { local n; for n in "${KAFKA_CLUSTER_NODES[@]}"; do cluster_node_ready "$n" || return 1; done; }
cluster_alive() {
    local n pid
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do
        pid=$(read_pid "$(cluster_pid_file "$n")") && ! pid_gone "$pid" || return 1
    done
}

cmd_up_kafka_cluster() {  # start the nodes that do not run (all, or one a test killed)
    local t0=$SECONDS n pid p
    lock_stack
    mkdir -p "$KAFKA_CLUSTER_HOME"
    kafka_libs
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do
        mkdir -p "$(cluster_node_dir "$n")" "$KAFKA_CLUSTER_LOG_DIR/broker-$n"
        if pid=$(cluster_pid "$n"); then
            info "kafka-cluster: broker $n already running (pid $pid)"
            continue
        fi
        rm -f "$(cluster_pid_file "$n")"
        for p in "$(cluster_port "$n")" "$(cluster_controller_port "$n")"; do
            if port_open "$p"; then die "kafka-cluster: port 127.0.0.1:$p is already in use by another process"; fi
        done
        cluster_render_config "$n"
        cluster_format "$n"
        info "kafka-cluster: starting broker $n on 127.0.0.1:$(cluster_port "$n") (controller $(cluster_controller_port "$n"))"
        cluster_launch "$n"
    done
    if ! wait_for kafka-cluster cluster_ready cluster_alive; then
        for n in "${KAFKA_CLUSTER_NODES[@]}"; do show_log_tail "$KAFKA_CLUSTER_LOG_DIR/broker-$n/kafka.out"; done
        die "kafka-cluster: not ready; logs in $KAFKA_CLUSTER_LOG_DIR"
    fi
    info "kafka-cluster: ready on $(cluster_bootstrap) in $((SECONDS - t0))s (Kafka $(kafka_version))"
}

cmd_down_kafka_cluster() {  # SIGTERM every node at once (controlled shutdown), SIGKILL past the timeout
    local n pid stopping=()
    lock_stack
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do
        if pid=$(cluster_pid "$n"); then
            info "kafka-cluster: stopping broker $n (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            stopping+=("$pid")
        fi
        rm -f "$(cluster_pid_file "$n")"
    done
    for pid in "${stopping[@]}"; do
        if ! wait_gone "$pid" "$TIMEOUT"; then
            warn "kafka-cluster: pid $pid still running after ${TIMEOUT}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 10 || die "kafka-cluster: pid $pid does not exit"
        fi
    done
    info "kafka-cluster: stopped"
}

cmd_status_kafka_cluster() {
    local n pid rc=0
    for n in "${KAFKA_CLUSTER_NODES[@]}"; do
        if pid=$(cluster_pid "$n") && kafka_probe "$(cluster_port "$n")"; then
            printf '%-10s up    127.0.0.1:%s (controller %s)  pid %s\n' "broker-$n" "$(cluster_port "$n")" "$(cluster_controller_port "$n")" "$pid"
        else
            printf '%-10s down  127.0.0.1:%s%s\n' "broker-$n" "$(cluster_port "$n")" "$(foreign_port_note "$(cluster_port "$n")")"
            rc=1
        fi
    done
    return "$rc"
}

cmd_env_kafka_cluster() {
    printf 'export MEMPROJ_KAFKA_BOOTSTRAP=%s\n' "$(cluster_bootstrap)"
    printf 'export MEMPROJ_TOPIC_REPLICATION_FACTOR=%s\n' "$KAFKA_CLUSTER_REPLICATION_FACTOR"
    printf 'export MEMPROJ_TOPIC_MIN_INSYNC_REPLICAS=%s\n' "$KAFKA_CLUSTER_MIN_INSYNC_REPLICAS"
}
