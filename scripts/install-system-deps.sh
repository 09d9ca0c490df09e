#!/usr/bin/env bash
# Installs the system packages statetier's tests need, when they are missing.
# Runs before the virtual environment is created; safe to run again.
set -euo pipefail

need=()
command -v python3 >/dev/null || need+=(python3 python3-venv)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "statetier: missing system packages: ${need[*]} (install them, or run as root)" >&2
        exit 1
    fi
    echo "statetier: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Spark pipeline (issue 5) runs PySpark, which needs a Java runtime (17).
if ! command -v java >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "statetier: java is missing (install openjdk-17-jre-headless, or run as root)" >&2
        exit 1
    fi
    echo "statetier: installing openjdk-17-jre-headless"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

# Packaging (issue 8): promtool checks and unit-tests the alert rules (Debian's prometheus
# package). Optional: without it those tests skip, so a failure here only warns.
if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "statetier: promtool is missing; the alert-rule tests will skip (apt-get install prometheus as root)" >&2
    else
        echo "statetier: installing prometheus (for promtool)"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
            echo "statetier: could not install prometheus; the alert-rule tests will skip" >&2
        fi
    fi
fi
