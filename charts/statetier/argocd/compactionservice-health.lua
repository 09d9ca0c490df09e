-- Argo CD health check of statetier.io/CompactionService (argocd-cm key
-- resource.customizations.health.statetier.io_CompactionService). Reads the status the operator
-- writes: Healthy when Ready is True for the current generation, Degraded when Degraded is True,
-- Progressing otherwise.
hs = {status = "Progressing", message = "Waiting for the operator"}
if obj.status ~= nil and obj.status.conditions ~= nil then
  if obj.status.observedGeneration ~= obj.metadata.generation then
    hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
    return hs
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Degraded" and c.status == "True" then
      return {status = "Degraded", message = c.reason .. ": " .. (c.message or "")}
    end
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Ready" then
      if c.status == "True" then
        return {status = "Healthy", message = c.message or c.reason}
      end
      hs.message = c.reason .. ": " .. (c.message or "")
    end
  end
end
return hs
