# Sourced by .ci/run: install and start PostgreSQL from Debian packages, create the test database,
# and export DHP_TEST_DATABASE_URL for tests/test_store.py.
_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
_as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sudo -u postgres sh -c "$1"; fi; }
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  _sudo apt-get update -qq
  _sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
PG_VERSION=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$PG_VERSION main$"; then
  _sudo pg_createcluster "$PG_VERSION" main >/dev/null
fi
pg_lsclusters -h | awk -v v="$PG_VERSION" '$1==v && $2=="main"' | grep -q online || _sudo pg_ctlcluster "$PG_VERSION" main start
PG_PORT=$(pg_lsclusters -h | awk -v v="$PG_VERSION" '$1==v && $2=="main" {print $3}')
_as_pg "psql -p $PG_PORT -tAc \"SELECT 1 FROM pg_roles WHERE rolname='dhp'\"" | grep -q 1 \
  || _as_pg "psql -p $PG_PORT -qc \"CREATE USER dhp WITH PASSWORD 'dhp' CREATEDB\""
_as_pg "psql -p $PG_PORT -tAc \"SELECT 1 FROM pg_database WHERE datname='dhp_test'\"" | grep -q 1 \
  || _as_pg "createdb -p $PG_PORT -O dhp dhp_test"
export DHP_TEST_DATABASE_URL="postgresql+psycopg://dhp:dhp@127.0.0.1:$PG_PORT/dhp_test"
echo "PostgreSQL $PG_VERSION on port $PG_PORT: DHP_TEST_DATABASE_URL=$DHP_TEST_DATABASE_URL"
