-- Argo CD health check for echorl.dev/EchoJob (argocd-cm: resource.customizations.health.echorl.dev_EchoJob).
-- Reads the conditions the Echo operator writes; tested by tests/unit/operator/test_operator_argocd.py.
--   Suspended        spec.suspend scaled the job to zero
--   Degraded         Degraded=True (a missing reference, storage, a spec the API server refused,
--                    the bound broken; also while observedGeneration lags the spec), or
--                    StalenessBounded=False (a pool cannot keep up with maxStaleness)
--   Healthy          Progressing=False/Completed (trained every policy version), or Ready=True
--   Progressing      anything else: not observed yet, the operator behind the spec, pods starting
-- observedGeneration is the newest generation whose children the operator applied.
local hs = {}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Echo operator to report status"
  return hs
end

local conditions = obj.status.conditions
local suspended = condition(conditions, "Suspended")
local degraded = condition(conditions, "Degraded")
local bounded = condition(conditions, "StalenessBounded")
local progressing = condition(conditions, "Progressing")
local ready = condition(conditions, "Ready")

-- Before the generation check: a spec the operator could not apply (ApplyFailed, a missing
-- reference) leaves observedGeneration behind, and is Degraded, not Progressing.
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the Echo operator to reconcile generation " .. tostring(generation)
  return hs
end

if suspended ~= nil and suspended.status == "True" then
  hs.status = "Suspended"
  hs.message = suspended.message or "Suspended"
  return hs
end
if bounded ~= nil and bounded.status == "False" then
  hs.status = "Degraded"
  hs.message = (bounded.reason or "StalenessBounded") .. ": " .. (bounded.message or "")
  return hs
end
if progressing ~= nil and progressing.status == "False" and progressing.reason == "Completed" then
  hs.status = "Healthy"
  hs.message = progressing.message or "Completed"
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for the job's components"
end
return hs
