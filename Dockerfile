# slagate gateway image.
#
#   docker build -t slagate .
#   docker run --rm -p 8080:8080 slagate                      # default config: a simulated fleet
#   docker run --rm -p 8080:8080 -v $PWD/my-config:/etc/slagate:ro slagate   # my-config/gateway.yaml
#   docker run --rm --read-only -p 8080:8080 slagate                        # writes nothing to disk
#
# The sources are TypeScript, loaded by bin/ts-loader.js (esbuild, a runtime dependency, strips
# the types as each file is imported), so there is no build step:
# the image holds the production node_modules, bin/, src/, config/ and the package files.
# `node` is PID 1 (exec form, no npm, no shell), so `docker stop` / Kubernetes' SIGTERM reaches the
# gateway itself, which then drains for server.shutdown_grace_ms (default 30 s) and exits.
# Keep `docker stop --time` / terminationGracePeriodSeconds above that grace.

ARG NODE_IMAGE=node:20.20.2-bookworm-slim

FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# Runtime dependencies only (esbuild included: the entry's TypeScript loader uses it).
RUN npm ci --omit=dev --no-audit --no-fund \
 && npm cache clean --force

FROM ${NODE_IMAGE}
ENV NODE_ENV=production
WORKDIR /app
# Owned by root and read-only for the `node` user: the process needs no write access to /app.
COPY --from=deps /app/node_modules ./node_modules
COPY package.json package-lock.json tsconfig.json ./
COPY bin ./bin
COPY src ./src
COPY config ./config
# The default configuration (simulated fleet) where the CMD looks; mount your own over it.
COPY config/gateway.yaml /etc/slagate/gateway.yaml

# The official image's unprivileged user (uid 1000).
USER node

EXPOSE 8080

# Liveness of the gateway's own HTTP server. The URL is an image-level variable (not read by
# slagate): override it when the gateway listens on another port, e.g. in docker-compose.yml.
ENV HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch(process.env.HEALTHCHECK_URL).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["node", "bin/slagate.js"]
CMD ["serve", "--config", "/etc/slagate/gateway.yaml", "--host", "0.0.0.0"]
