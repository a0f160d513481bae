// The gateway's errors: one stable code per failure with its HTTP status and OpenAI envelope, and
// the only bytes the gateway itself writes for them. Every layer that refuses or fails a request
// imports these from here, so no layer reaches into another's internals for them.
export { type ErrorCode, GatewayError, INTERNAL_MESSAGE, isGatewayError } from './gateway-error.ts';
export { headersWith, sseErrorFrames, writeErrorResponse } from './respond.ts';
